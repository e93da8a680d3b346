"""The whole deployment on private servers, for fault tests: break a part, check the log.

A `Stack` is a private Redis, a database on a private Postgres cluster, and the
`contextlog` processes of the Procfile (any number of ingests, a worker), each of which a
test may SIGKILL, SIGSTOP/SIGCONT or restart; the servers themselves may be crashed and
restarted. A `Load` pushes valid messages from a thread at a steady rate and records
what Redis accepted, in push order; the `assert_*` checkers hold the log to it.

    stack.add_ingest(); stack.add_ingest()
    with Load(stack.redis.url) as load:
        stack.freeze(stack.ingests[0])         # or stack.pg.crash(); stack.pg.start()
    stack.wait_stored(load)
    assert_exactly_once_in_order(stack.database_url, load)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
import redis

from contextlog.producers import Producer
from contextlog.schema import keys
from contextlog.schema.errors import PushUncertain, Unavailable
from contextlog.worker.ingest import deadletters
from tests.support.processes import ROOT, Process, offline_env
from tests.support.servers import PostgresCluster, RedisServer

SHARDS = 4
LETTERS_MAX = 100_000
LOAD_AGENT = "load"
STALL_S = 30.0  # a log that stops growing short of its target fails this soon
PUSH_RETRY_S = 60.0  # how long the load keeps retrying a batch through an outage
READY_S = 60.0  # for a process to start serving


class Stack:
    """Private servers plus the processes of the Procfile, each one breakable."""

    def __init__(self, workdir: Path, pg: PostgresCluster, rds: RedisServer, db: str) -> None:
        self.workdir = workdir
        self.pg = pg
        self.redis = rds
        self.database_url = db
        self.env = offline_env(
            db,
            rds.url,
            CONTEXTLOG_SHARDS=str(SHARDS),
            CONTEXTLOG_LOG_LEVEL="warning",
            CONTEXTLOG_LOG_FORMAT="console",
            CONTEXTLOG_BLOCK_MS="100",
            # Back in business quickly after an outage (the default backs off to 10 s).
            CONTEXTLOG_BACKOFF_MAX="0.5",
        )
        self.ingests: list[Process] = []
        self.workers: list[Process] = []
        self.client = redis.Redis.from_url(rds.url, socket_timeout=10)

    # -- processes ----------------------------------------------------------------------
    def add_ingest(self, **env: str) -> Process:
        """Start one more `contextlog ingest`, consumer `ingest-<n>` (stable across restarts)."""
        return self._add("ingest", self.ingests, env)

    def add_worker(self, **env: str) -> Process:
        """Start one more `contextlog worker`, consumer `worker-<n>`."""
        return self._add("worker", self.workers, env)

    def _add(self, command: str, started: list[Process], env: dict[str, str]) -> Process:
        name = f"{command}-{len(started)}"
        extra = {"CONTEXTLOG_CONSUMER": name, **env}
        p = Process(command, {**self.env, **extra}, self.workdir / f"{name}.log")
        started.append(p)
        return self.start(p)

    def start(self, p: Process) -> Process:
        """Start (or restart) `p` and wait until it serves: a fault injected while it still
        imports and migrates would test start-up, which fails fast when a server is down."""
        launched_ms = time.time() * 1000
        p.start()
        assert p.proc is not None
        pid, consumer = p.proc.pid, p.env["CONTEXTLOG_CONSUMER"]
        lease_ms = float(p.env.get("CONTEXTLOG_LEASE_SECONDS", "15")) * 1000

        def ready() -> bool:
            if p.command == "ingest":  # it announced itself to the other ingests, since
                # its launch (a killed incarnation's announcement lasts a lease)
                score = self.client.zscore(keys.MEMBERS, consumer)
                return score is not None and score > launched_ms + lease_ms
            # RQ registered this incarnation (not a dead one) under the worker's name.
            registered = self.client.hget(f"rq:worker:contextlog-{consumer}", "pid")
            return registered == str(pid).encode()

        deadline = time.monotonic() + READY_S
        while not ready():
            if p.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{p.command} #{p.starts} did not start:\n{p.tail(40)}")
            time.sleep(0.05)
        return p

    def freeze(self, p: Process) -> None:
        """SIGSTOP `p`: it keeps its leases, connections and the batch in its hands, frozen."""
        assert p.proc is not None
        os.kill(p.proc.pid, signal.SIGSTOP)

    def thaw(self, p: Process) -> None:
        """SIGCONT `p`: it carries on from where it was, unaware of the time that passed."""
        assert p.proc is not None
        os.kill(p.proc.pid, signal.SIGCONT)

    def assert_running(self) -> None:
        """Every process the test started is still alive, or fail with its log's tail."""
        for p in self.ingests + self.workers:
            if p.proc is None or p.proc.poll() is not None:
                code = None if p.proc is None else p.proc.returncode
                raise AssertionError(f"{p.command} exited ({code}):\n{p.tail(60)}")

    def tails(self) -> str:
        """The end of every process's log, for failure messages."""
        return "\n".join(
            f"--- {p.log_path.name} ---\n{p.tail(30)}" for p in self.ingests + self.workers
        )

    def close(self) -> None:
        """Stop every process (SIGCONT first, in case a test left one stopped)."""
        for p in self.ingests + self.workers:
            if p.proc is not None and p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)
            p.stop()
        self.client.close()

    def cli(
        self, *args: str, timeout: float = 60.0, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run `contextlog ARGS` against the stack (with `env` over its environment)."""
        return subprocess.run(
            [sys.executable, "-m", "contextlog.worker.cli.main", *args],
            env={**self.env, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def problems(self) -> list[str]:
        """What `contextlog status --json` says is wrong (empty when healthy)."""
        return problems_of(self.cli("status", "--json"))

    def sigterm(self, p: Process) -> tuple[float, int]:
        """SIGTERM `p` (its process group) and wait for it: how long it took, its exit code."""
        assert p.proc is not None
        started = time.monotonic()
        os.killpg(p.proc.pid, signal.SIGTERM)
        code = p.proc.wait(timeout=60)
        return time.monotonic() - started, code

    # -- reading the outcome --------------------------------------------------------------
    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one query on the stack's database."""
        with psycopg.connect(self.database_url, connect_timeout=5) as conn:
            return conn.execute(query, params).fetchall()

    def count(self, agent: str) -> int:
        """Events stored for `agent`."""
        return int(self.sql("SELECT count(*) FROM events WHERE agent = %s", (agent,))[0][0])

    def wait_stored(self, load: Load, timeout: float = 120.0) -> None:
        """Poll until the log holds as many of the load's events as were pushed; fail early
        when it stops growing, with the processes' logs."""
        wait_growing(lambda: self.count(load.agent), load.total, timeout, self.tails)

    def dead_letters(self) -> dict[tuple[str, str], dict[bytes, bytes]]:
        """Every dead letter, by (stream, entry id) of the entry it came from."""
        out = {}
        for _, fields in deadletters.newest(self.client, SHARDS, LETTERS_MAX):
            where = (fields[b"stream"].decode(), fields[b"entry_id"].decode())
            out[where] = fields
        return out


def problems_of(status: subprocess.CompletedProcess[str]) -> list[str]:
    """The problems a `contextlog status --json` run printed (it ran: exit 0 or 1)."""
    assert status.returncode in (0, 1) and status.stdout, (
        f"status: {status.returncode} {status.stderr}"
    )
    problems: list[str] = json.loads(status.stdout)["problems"]
    return problems


def until(check: Callable[[], object], timeout: float, describe: Callable[[], str]) -> None:
    """Poll `check` until it holds; at `timeout`, fail with `describe()` (called then, so
    it shows the state at the failure, not at the start)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s: {describe()}")
        time.sleep(0.05)


def wait_growing(
    count: Callable[[], int], target: int, timeout: float, context: Callable[[], str]
) -> None:
    """Poll `count()` until it reaches `target`; fail at `timeout`, or once it has not
    grown for STALL_S."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while (n := count()) < target:
        now = time.monotonic()
        if n != last:
            last, since = n, now
        if now > deadline or now - since > STALL_S:
            raise AssertionError(
                f"{n} of {target} stored, no growth for {now - since:.0f}s\n{context()}"
            )
        time.sleep(0.05)


@dataclass
class Load:
    """Valid messages pushed from a thread at `rate` per second, in batches; `pushed` holds
    each conversation's event ids in the order Redis accepted them.

    Each message has an external id, so its event id is derived: a batch that fails (Redis
    down) is pushed again as is, and whatever of it landed twice is absorbed by ingest.
    """

    redis_url: str
    rate: float = 1000.0
    conversations: int = 20
    batch: int = 20
    agent: str = LOAD_AGENT
    pushed: dict[str, list[str]] = field(default_factory=dict)
    failed_pushes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counters: dict[int, int] = field(default_factory=dict)  # next message number of each
    _sent: int = 0
    uncertain: list[PushUncertain] = field(default_factory=list)  # `push_once`'s, to resend

    def __enter__(self) -> Load:
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def total(self) -> int:
        """Events pushed so far."""
        with self._lock:
            return sum(len(ids) for ids in self.pushed.values())

    def stop(self) -> None:
        """Stop pushing (the batch in hand is finished); re-raise what broke the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=PUSH_RETRY_S + 10)
            assert not self._thread.is_alive(), "the load thread did not stop"
        if self._error is not None:
            raise AssertionError(f"the load failed: {self._error!r}") from self._error

    def wait_pushed(self, at_least: int, timeout: float = 30.0) -> None:
        """Until `at_least` events are pushed in all."""
        wait_growing(lambda: self.total, at_least, timeout, lambda: "the load is stuck")

    def snapshot(self) -> dict[str, int]:
        """How many events each conversation has pushed so far."""
        with self._lock:
            return {c: len(ids) for c, ids in self.pushed.items()}

    def _run(self) -> None:
        client = redis.Redis.from_url(self.redis_url, socket_timeout=2, socket_connect_timeout=2)
        producer = Producer(client, shards=SHARDS)
        interval = self.batch / self.rate
        due = time.monotonic()
        try:
            while not self._stop.is_set():
                self._push(producer, self.next_batch())
                due += interval
                self._stop.wait(max(0.0, due - time.monotonic()))
                due = max(due, time.monotonic() - 1.0)  # after an outage: no catch-up burst
        except BaseException as e:  # reported by stop(), in the test's thread
            self._error = e
        finally:
            producer.close()

    def next_batch(self) -> list[tuple[str, int]]:
        """The next `batch` messages, (conversation, its message number), round robin."""
        batch = []
        for _ in range(self.batch):
            c = self._sent % self.conversations
            n = self._counters.get(c, 0)
            batch.append((f"c{c}", n))
            self._counters[c] = n + 1
            self._sent += 1
        return batch

    def push_once(self, producer: Producer, batch: list[tuple[str, int]]) -> Unavailable | None:
        """Push `batch` once, from the caller's thread: None when Redis took it (recorded
        as pushed), else Redis's refusal (nothing recorded: push it again). A push that
        may have been stored part-way is recorded and kept in `uncertain`, to `resend`."""
        try:
            self._record(batch, self._send(producer, batch))
        except PushUncertain as e:
            self._record(batch, e.event_ids)
            self.uncertain.append(e)
            return e
        except Unavailable as e:
            return e
        return None

    def _push(self, producer: Producer, batch: list[tuple[str, int]]) -> None:
        deadline = time.monotonic() + PUSH_RETRY_S
        while True:
            try:
                ids = self._send(producer, batch)
                break
            except Unavailable:
                self.failed_pushes += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._record(batch, ids)

    def _send(self, producer: Producer, batch: list[tuple[str, int]]) -> list[str]:
        with producer.batch() as b:
            for channel, n in batch:
                b.post_message(
                    self.agent,
                    channel,
                    "user" if n % 2 == 0 else "assistant",
                    content(channel, n),
                    source="load",
                    external_id=f"{channel}#{n}",
                )
        return list(b.ids)

    def _record(self, batch: list[tuple[str, int]], ids: list[str]) -> None:
        with self._lock:
            for (channel, _), event_id in zip(batch, ids, strict=True):
                self.pushed.setdefault(channel, []).append(str(event_id))


def content(channel: str, n: int) -> str:
    """The text of a conversation's n-th message: identity and order in one."""
    return f"{channel}#{n}"


def stored(database_url: str, agent: str) -> dict[str, list[tuple[int, str, str]]]:
    """(seq, event id, text) of each conversation of `agent`, in seq order."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT channel, seq, event_id::text, payload->>'content' FROM events"
            " WHERE agent = %s ORDER BY channel, seq",
            (agent,),
        ).fetchall()
    out: dict[str, list[tuple[int, str, str]]] = {}
    for channel, seq, event_id, text in rows:
        out.setdefault(channel, []).append((seq, event_id, text))
    return out


def assert_exactly_once_in_order(database_url: str, load: Load) -> None:
    """Every pushed event stored once, each conversation in push order with seq 1..n."""
    log = stored(database_url, load.agent)
    assert sorted(log) == sorted(load.pushed), "stored conversations differ from pushed ones"
    for channel, ids in load.pushed.items():
        got = log[channel]
        assert [s for s, _, _ in got] == list(range(1, len(got) + 1)), f"{channel}: seq gaps"
        got_ids = [e for _, e, _ in got]
        if got_ids != ids:
            missing = set(ids) - set(got_ids)
            extra = len(got_ids) - len(set(got_ids))
            first = next(i for i, (a, b) in enumerate(zip(got_ids, ids, strict=False)) if a != b)
            raise AssertionError(
                f"{channel}: {len(got_ids)} stored, {len(ids)} pushed, {len(missing)} missing, "
                f"{extra} doubled; first difference at position {first}: stored "
                f"{[t for _, _, t in got[first : first + 3]]}"
            )
        assert [t for _, _, t in got] == [content(channel, n) for n in range(len(ids))]


def assert_in_order_without_doubles(
    database_url: str, load: Load, must_have: dict[str, int]
) -> dict[str, int]:
    """For a run that lost data on purpose (Redis without persistence): each conversation's
    stored events are a subsequence of what was pushed, in push order, none twice, seq
    1..n; every event pushed from position `must_have[channel]` on is stored. Returns how
    many events each conversation lost."""
    log = stored(database_url, load.agent)
    lost = {}
    for channel, ids in load.pushed.items():
        got = [e for _, e, _ in log.get(channel, [])]
        assert len(got) == len(set(got)), f"{channel}: an event is stored twice"
        seqs = [s for s, _, _ in log.get(channel, [])]
        assert seqs == list(range(1, len(got) + 1)), f"{channel}: seq gaps"
        position = {e: i for i, e in enumerate(ids)}
        assert all(e in position for e in got), f"{channel}: stored an event never pushed"
        order = [position[e] for e in got]
        assert order == sorted(order), f"{channel}: stored order is not push order"
        tail = ids[must_have.get(channel, 0) :]
        absent = set(tail) - set(got)
        assert not absent, f"{channel}: {len(absent)} events pushed after the restart are lost"
        lost[channel] = len(ids) - len(got)
    return lost
