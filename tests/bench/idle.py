"""Benchmark "idle": 10,000 conversations go idle at once, and what idle timers cost
during a 100,000-message run.

Part 1 configures N conversations with a 30 s idle timeout and posts one message to
each, all with the same `occurred_at`, so every deadline is the same instant, through a
running `contextlog ingest`; W `contextlog worker` processes (one of them holding RQ's
scheduler) auto-save them. A conversation's delay is its auto session's `created_at` (the
save event's `occurred_at`, the idle job's clock) minus the deadline. The physical limit
is W plain RQ SimpleWorkers draining as many no-op jobs, measured in the same run.

Part 2 has a fresh ingest drain 100,000 messages over 1,000 conversations twice: with 1 h
idle timeouts (so nothing fires) and with idle timeouts off (0). INFO commandstats is
server-wide, so the commands attributable to timers are the difference between the two
drains, and the pair is run again (up to 3 times) while other clients blur it; the RQ
jobs per conversation are read from the `idle` queue's scheduled registry.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import itertools
import math
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies
import psycopg
import redis
from psycopg.rows import TupleRow
from rq import Queue, Worker
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, ScheduledJobRegistry
from rq.scheduler import RQScheduler
from rq.utils import utcparse

from contextlog.producers import Batch, Producer
from contextlog.schema.queries import query
from contextlog.worker.app.config import DEFAULT_BATCH_SIZE
from contextlog.worker.ingest import deadletters
from contextlog.worker.tasks.queue import SUMMARIES
from contextlog.worker.tasks.timers import IDLE, PART
from tests.bench.harness import (
    ROOT,
    STOP_TIMEOUT,
    BenchEnv,
    BenchError,
    CpuMeter,
    Result,
    is_local,
    python_module,
    redis_cpu,
)
from tests.bench.workload import Traffic
from tests.support.services import flush_owned, truncate

LOAD_MESSAGES = 100_000  # part 2's drain; --events changes it, and part 1 idles a tenth
LOAD_CONVERSATIONS = 1000
LOAD_IDLE_TIMEOUT = 3600  # part 2: no timer fires during the run
# Part 1: 10,000 timers were armed 8.6 s after the messages' occurred_at (push, ingest,
# an RQ schedule each) on the 2-core reference machine shared with other work; 30 s
# leaves room, and ARM_MARGIN_S turns a slower box into a clear failure.
IDLE_TIMEOUT = 30
ARM_MARGIN_S = 5.0  # part 1 fails if the timers are armed later than this before the deadline
WORKERS = 2  # one per core of the reference machine; one of them runs RQ's scheduler
SHARDS = 4
TIMERS = "contextlog:idle:*"  # one Redis hash per armed conversation
FILL_BATCH = 1000  # events per producer pipeline
POLL_SECONDS = 0.1
START_TIMEOUT_S = 60.0
SAVE_TIMEOUT_S = 600.0  # from the deadline until every conversation is saved
SUMMARY_TIMEOUT_S = 300.0  # then until every auto session has its summary
STALL_S = 10.0  # summaries are given up when none lands for this long with nothing queued
DRAIN_ATTEMPTS = 3  # part 2's pairs of drains, while other clients blur the counts
CLEAN_SHARE = 0.02  # of the timers' calls: the other commands that may differ in a clean pair
SETTLE_S = 1.0  # after the last commit, for its timers to be armed (they follow the commit)
NOOP_QUEUE = "bench-noop"
# An idle check is a Postgres read, a Redis script and a push on top of RQ's own ~10
# commands per job; half of RQ's bare throughput is the aim.
TARGET_RATIO = 0.5
AGENT = "support-bot"
SOURCE = "discord"
# What the arm script and RQ's unique-schedule script run inside Redis: INFO commandstats
# counts them, but they are no round trips.
SCRIPT_INSIDE = ("hget", "hset", "pexpire", "exists", "expire", "zadd", "sadd")
SCRIPT_CALLS = ("evalsha", "eval", "script|exists", "script|load")


def noop() -> None:
    """The limit's job: RQ's own cost per job and nothing else."""


class Group:
    """A process in a session of its own: SIGTERM to its group reaches the children it
    forks (an RQ worker's scheduler), and SIGKILL leaves no orphan behind."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        self.name = name
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  # closed by stop()
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            start_new_session=True,
        )
        self.status: int | str | None = None
        self._kept: list[str] | None = None  # the log, once the process is stopped

    def check(self) -> None:
        """Fail, with its log, if the process has exited."""
        if self.proc.poll() is not None:
            raise BenchError(
                f"{self.name} exited with status {self.proc.returncode}:\n{self.tail()}"
            )

    def signal(self, sig: int) -> bool:
        """Signal every process of the group; False when none is left."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def lines(self) -> list[str]:
        """What the process wrote to stderr so far."""
        if self._kept is not None:
            return self._kept
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace").splitlines()

    def tail(self, n: int = 15) -> str:
        """The last lines of its stderr."""
        return "\n".join(self.lines()[-n:])


def stop(groups: Sequence[Group]) -> dict[str, int | str]:
    """SIGTERM to every group at once, SIGKILL to whatever is left after STOP_TIMEOUT;
    each leader's exit status, or "killed"."""
    running = [g for g in groups if g.status is None]
    for g in running:
        g.signal(signal.SIGTERM)
    deadline = time.perf_counter() + STOP_TIMEOUT
    for g in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            g.proc.wait(max(0.1, deadline - time.perf_counter()))
    while any(g.signal(0) for g in running) and time.perf_counter() < deadline:
        time.sleep(0.05)  # an RQ scheduler child finishing its pass
    for g in running:
        killed = g.signal(signal.SIGKILL)
        g.proc.wait()
        g.status = "killed" if killed else g.proc.returncode
        g._kept = g.lines()
        g._log.close()
    return {g.name: g.status for g in groups if g.status is not None}


def run(env: BenchEnv) -> Result:
    """Part 2 (timer cost), then part 1 (N idle at once) between two runs of the no-op
    limit: on a shared machine the faster of the two is the better estimate of RQ's floor."""
    messages = env.events or LOAD_MESSAGES
    conversations = max(1, messages // 10)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    cost = Cost.measure(env, messages)
    before = _noop_limit(env, conversations)
    _reset(env)
    fired = _at_once(env, conversations)
    after = _noop_limit(env, conversations)
    return _result(fired, [before, after], cost, load_at_start)


# -- shared ------------------------------------------------------------------------------


def _contextlog(env: BenchEnv, command: str, name: str) -> Group:
    # No API key: the local summarizer, so a summary costs CPU here, not an API call.
    penv = env.process_env(
        CONTEXTLOG_LOG_LEVEL="warning", CONTEXTLOG_SHARDS=str(SHARDS), ANTHROPIC_API_KEY=""
    )
    return Group(name, python_module("contextlog.worker.cli.main", command), penv)


def _reset(env: BenchEnv) -> None:
    """Empty tables and the benchmark's Redis db between parts."""
    truncate(env.database_url)
    client = redis.Redis.from_url(env.redis_url)
    try:
        flush_owned(client)
    finally:
        client.close()


def _stored(conn: psycopg.Connection[TupleRow]) -> int:
    return int(conn.execute(query("events_stored")).fetchone()[0])  # type: ignore[index]


def _wait(what: str, done: Callable[[], bool], groups: Sequence[Group], timeout: float) -> None:
    """Poll `done` until true; fail if a process dies or `timeout` seconds pass."""
    deadline = time.perf_counter() + timeout
    while not done():
        for g in groups:
            g.check()
        if time.perf_counter() > deadline:
            raise BenchError(f"{what}: not done after {timeout:.0f}s\n{_logs(groups)}")
        time.sleep(POLL_SECONDS)


def _logs(groups: Sequence[Group]) -> str:
    tails = [(g.name, g.tail()) for g in groups]
    return "\n".join(f"--- {name}:\n{tail}" for name, tail in tails if tail.strip())


def _pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _spread(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    if not values:
        return {}
    picks = {"min": 0.0, "p50": 0.5, "p90": 0.9, "p99": 0.99, "max": 1.0}
    return {k: round(_pct(values, q) * scale, 3) for k, q in picks.items()}


def _cpu_line(usage: dict[str, float]) -> str:
    named = [
        f"{k.removesuffix('_cpu_seconds')} {v:.1f}s"
        for k, v in usage.items()
        if k.endswith("_cpu_seconds") and not k.startswith("machine")
    ]
    return (
        ", ".join(named) + f"; machine busy {usage['machine_busy_cpu_seconds']:.1f}s "
        f"of {usage['cores']:.0f} cores x {usage['wall_seconds']:.1f}s"
    )


# -- part 2: what timers cost during a run ------------------------------------------------


@dataclass(frozen=True)
class Drain:
    """One drain of part 2's backlog by a fresh ingest process."""

    idle_timeout: int
    messages: int
    seconds: float  # ingest's start to the last event stored
    commands: dict[str, int]  # INFO commandstats calls, ingest's start to SETTLE_S after
    jobs: int  # idle jobs in RQ's scheduled registry (none fires: no worker, long timeouts)
    timers: int  # timer hashes
    transactions: int  # ingest transactions that stored messages
    touches: int  # (transaction, conversation) pairs: conversations to arm, per batch
    others: dict[str, int]  # clients of other Redis dbs active meanwhile, by db and command


def _drain(env: BenchEnv, messages: int, idle_timeout: int) -> Drain:
    """Fill the streams, then time a fresh ingest storing them; count Redis commands."""
    _reset(env)
    client = redis.Redis.from_url(env.redis_url)
    producer = Producer.from_url(env.redis_url, shards=SHARDS)
    label = f"idle_timeout={idle_timeout}"
    try:
        traffic = Traffic(LOAD_CONVERSATIONS)
        print(f"  [{label}] filling {messages:,} messages ...", flush=True)
        with producer.batch() as b:
            for c in traffic.conversations:
                b.configure(c.agent, c.channel, idle_timeout=idle_timeout, source=c.source)
        stream = traffic.messages(messages)
        while chunk := list(itertools.islice(stream, FILL_BATCH)):
            with producer.batch() as b:
                for m in chunk:  # stamped now: the deadlines are an hour ahead
                    b.post_message(**{**dataclasses.asdict(m), "occurred_at": None})
        total = messages + LOAD_CONVERSATIONS
        with psycopg.connect(env.database_url, autocommit=True) as conn:
            before, started = _commandstats(client), time.perf_counter()
            ingest = _contextlog(env, "ingest", "contextlog ingest")
            try:
                _wait("ingest drain", lambda: _stored(conn) >= total, [ingest], 60 + total / 500)
                seconds = time.perf_counter() - started
                time.sleep(SETTLE_S)
                after, window = _commandstats(client), time.perf_counter() - started
            finally:
                status = stop([ingest])
            # recorded_at is now(), the start of the row's transaction: one value per batch.
            transactions, touches = conn.execute(
                "SELECT count(DISTINCT recorded_at), count(DISTINCT (recorded_at, agent, channel))"
                " FROM events WHERE kind = 'message.v1'"
            ).fetchone()  # type: ignore[misc]
        if status[ingest.name] != 0:
            raise BenchError(f"ingest exited with {status} after SIGTERM")
        drain = Drain(
            idle_timeout=idle_timeout,
            messages=messages,
            seconds=seconds,
            commands={k: after.get(k, 0) - before.get(k, 0) for k in after},
            jobs=_scheduled(client),
            timers=_count_keys(client, "contextlog:idle:*"),
            transactions=int(transactions),
            touches=int(touches),
            others=_others_active(client, window),
        )
    finally:
        producer.close()
        client.close()
    print(
        f"  [{label}] ingest: {messages / seconds:,.0f} messages/s ({seconds:.2f}s); "
        f"{drain.jobs} idle jobs scheduled, {drain.timers} timers",
        flush=True,
    )
    return drain


def _commandstats(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _scheduled(client: redis.Redis) -> int:
    """Jobs waiting in the `idle` queue's scheduled registry."""
    return int(ScheduledJobRegistry(IDLE, connection=client).count)  # type: ignore[no-untyped-call]


def _count_keys(client: redis.Redis, pattern: str) -> int:
    return sum(1 for _ in client.scan_iter(match=pattern, count=1000))


def _others_active(client: redis.Redis, seconds: float) -> dict[str, int]:
    """Clients of other dbs that sent a command in the last `seconds`: INFO commandstats
    counts theirs too (those that disconnected meanwhile are not seen)."""
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    active = collections.Counter(
        f"db{c['db']} {c['cmd']}"
        for c in client.client_list()
        if int(c["db"]) != db and int(c["idle"]) <= seconds
    )
    return dict(active)


@dataclass(frozen=True)
class Cost:
    """Part 2's verdict, from INFO commandstats: the commands of the drain with timers
    beyond those of the drain without. The counts are server-wide: other clients'
    commands land in the difference too, and `noise` sums it over commands timers do
    not issue."""

    messages: int
    diff: dict[str, int]  # calls with timers minus without, by command
    calls: int  # script calls and loads: the round trips timers add
    inside: int  # commands run inside those scripts: no round trips
    noise: int
    attempts: int  # drain pairs run until one was clean
    with_timers: Drain
    without: Drain

    @property
    def clean(self) -> bool:
        """Whether other clients left the counts alone (within CLEAN_SHARE)."""
        return self.noise <= CLEAN_SHARE * max(1, self.calls)

    @classmethod
    def measure(cls, env: BenchEnv, messages: int) -> Cost:
        """Drain with timers, then without; again while other clients blur the counts."""
        tries: list[Cost] = []
        while len(tries) < DRAIN_ATTEMPTS and not (tries and tries[-1].clean):
            on = _drain(env, messages, LOAD_IDLE_TIMEOUT)
            tries.append(cls.of(on, _drain(env, messages, 0), len(tries) + 1))
        return min(tries, key=lambda c: c.noise / max(1, c.calls))

    @classmethod
    def of(cls, on: Drain, off: Drain, attempts: int) -> Cost:
        names = sorted(set(on.commands) | set(off.commands))
        diff = {k: on.commands.get(k, 0) - off.commands.get(k, 0) for k in names}
        diff = {k: v for k, v in diff.items() if v}
        return cls(
            messages=on.messages,
            diff=diff,
            calls=sum(diff.get(k, 0) for k in SCRIPT_CALLS),
            inside=sum(diff.get(k, 0) for k in SCRIPT_INSIDE),
            noise=sum(abs(v) for k, v in diff.items() if k not in SCRIPT_CALLS + SCRIPT_INSIDE),
            attempts=attempts,
            with_timers=on,
            without=off,
        )


# -- part 1: N conversations idle at once -------------------------------------------------


@dataclass(frozen=True)
class Fired:
    """Part 1's measurements."""

    conversations: int
    push_seconds: float  # the messages' push
    armed_seconds: float  # from the messages' occurred_at until every timer was armed
    delays: list[float]  # per conversation: its auto save's created_at minus the deadline
    marks: dict[str, float]  # seconds after the deadline (bench's wall clock)
    jobs: dict[str, Any]  # idle jobs: how many, and when RQ released, started and ran them
    checks: dict[str, Any]
    cpu: dict[str, float]  # from the deadline until every session was stored
    scheduler: str  # the worker holding RQ's scheduler lock


def _at_once(env: BenchEnv, n: int) -> Fired:
    """Ingest and W workers; N conversations configured, then one message each with one
    occurred_at; wait for every auto-save and summary."""
    groups: list[Group] = []
    with contextlib.ExitStack() as stack:
        client = redis.Redis.from_url(env.redis_url)
        stack.callback(client.close)
        producer = Producer.from_url(env.redis_url, shards=SHARDS)
        stack.callback(producer.close)
        conn = stack.enter_context(psycopg.connect(env.database_url, autocommit=True))
        stack.callback(stop, groups)
        groups.append(_contextlog(env, "ingest", "contextlog ingest"))
        groups += [_contextlog(env, "worker", f"contextlog worker {i}") for i in range(WORKERS)]
        scheduler = _wait_workers(client, groups)
        print(f"  {WORKERS} workers registered; {scheduler} runs RQ's scheduler", flush=True)
        at, at_perf, push_seconds, armed = _arm(producer, conn, client, groups, n)
        due, due_perf = at + dt.timedelta(seconds=IDLE_TIMEOUT), at_perf + IDLE_TIMEOUT
        time.sleep(max(0.0, due_perf - time.perf_counter()))
        cpu = _meter(env, conn, groups)
        marks, usage = _wait_saved(conn, client, groups, n, due_perf, cpu)
        delays = [
            (r[0] - due).total_seconds()
            for r in conn.execute("SELECT created_at FROM sessions WHERE auto")
        ]
        jobs = _idle_jobs(client, due.timestamp())
        checks = _check(conn, client, n, groups)
        checks["exit_statuses"] = stop(groups)
    if bad := {k: v for k, v in checks["exit_statuses"].items() if v != 0}:
        raise BenchError(f"processes exited badly after SIGTERM: {bad}")
    return Fired(n, push_seconds, armed, delays, marks, jobs, checks, usage, scheduler)


def _arm(
    producer: Producer,
    conn: psycopg.Connection[TupleRow],
    client: redis.Redis,
    groups: Sequence[Group],
    n: int,
) -> tuple[dt.datetime, float, float, float]:
    """Configure N conversations, then post one message to each, all stamped with the
    same instant; returns it (as a datetime and a perf_counter), the push's seconds, and
    the seconds from it until every timer was armed."""

    def configure(b: Batch, channel: str) -> None:
        b.configure(AGENT, channel, idle_timeout=IDLE_TIMEOUT)

    def message(b: Batch, channel: str) -> None:
        b.post_message(AGENT, channel, "user", _text(channel), source=SOURCE, occurred_at=at)

    _push(producer, n, configure)
    _wait("configure events stored", lambda: _stored(conn) >= n, groups, START_TIMEOUT_S)
    at, started = dt.datetime.now(dt.UTC), time.perf_counter()
    _push(producer, n, message)
    pushed = time.perf_counter() - started
    armed = lambda: _stored(conn) >= 2 * n and _count_keys(client, TIMERS) >= n  # noqa: E731
    _wait("timers armed", armed, groups, IDLE_TIMEOUT)
    seconds = time.perf_counter() - started
    print(f"  {n:,} messages pushed in {pushed:.2f}s, all armed after {seconds:.2f}s")
    if seconds > IDLE_TIMEOUT - ARM_MARGIN_S:
        raise BenchError(f"timers armed {seconds:.1f}s after occurred_at: raise IDLE_TIMEOUT")
    return at, started, pushed, seconds


def _conversation(i: int) -> str:
    return f"{SOURCE}:guild-{i % 37}:idle-{i:05d}"


def _text(channel: str) -> str:
    return f"Please keep the notes of {channel} until I am back; the deploy is on Friday."


def _push(producer: Producer, n: int, post: Callable[[Batch, str], object]) -> None:
    for start in range(0, n, FILL_BATCH):
        with producer.batch() as b:
            for i in range(start, min(n, start + FILL_BATCH)):
                post(b, _conversation(i))


def _wait_workers(client: redis.Redis, groups: Sequence[Group]) -> str:
    """Until W workers are registered and one holds the `idle` queue's scheduler lock."""
    lock = RQScheduler.get_locking_key(IDLE)
    _wait(
        "workers registered, scheduler started",
        lambda: Worker.count(connection=client) >= WORKERS and bool(client.exists(lock)),
        groups,
        START_TIMEOUT_S,
    )
    holder = client.get(lock)
    return holder.decode() if isinstance(holder, bytes) else str(holder)


def _meter(env: BenchEnv, conn: psycopg.Connection[TupleRow], groups: Sequence[Group]) -> CpuMeter:
    """CPU of ingest, the workers, RQ's scheduler (a worker's child), Redis and Postgres."""
    cpu = CpuMeter()
    for g in groups:
        name = "ingest" if g.name.endswith("ingest") else "workers"
        cpu.watch(name, g.proc.pid)
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(g.proc.pid).children():
                cpu.watch("scheduler", child.pid)
    cpu.watch_counter("redis_server", redis_cpu(env.redis_url))
    if is_local(env.database_url):
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
        for (pid,) in rows:
            cpu.watch("postgres_backends", int(pid))
    return cpu


def _wait_saved(
    conn: psycopg.Connection[TupleRow],
    client: redis.Redis,
    groups: Sequence[Group],
    n: int,
    due_perf: float,
    cpu: CpuMeter,
) -> tuple[dict[str, float], dict[str, float]]:
    """Poll until every conversation has its auto session, then until every summary has
    landed or the `summaries` queue has been empty, with nothing running and no new
    summary, for STALL_S; seconds after the deadline of each mark, and the CPU used until
    every session was stored."""
    marks: dict[str, float] = {}
    goals = {"first_session": 1, "half_sessions": n / 2, "all_sessions": n}
    usage: dict[str, float] = {}
    queue = Queue(SUMMARIES, connection=client)
    last = (-1, 0.0)  # summaries seen, and since when
    drained: float | None = None  # since when the summaries queue is empty, nothing running
    while True:
        for g in groups:
            g.check()
        saved, summarised = conn.execute(
            "SELECT count(*), count(summary) FROM sessions WHERE auto"
        ).fetchone()  # type: ignore[misc]
        now = time.perf_counter() - due_perf
        for name, goal in goals.items():
            if saved >= goal:
                marks.setdefault(name, round(now, 3))
        if saved < n and now > SAVE_TIMEOUT_S:
            raise BenchError(
                f"{now:.0f}s after the deadline: {saved:,} of {n:,} conversations auto-saved\n"
                + _logs(groups)
            )
        if saved >= n and not usage:
            usage = cpu.report()
            print(f"  {n:,} auto sessions stored {now:.2f}s after the deadline", flush=True)
        if summarised != last[0]:
            last = (summarised, now)
        idle = saved >= n and queue.count == 0 and queue.started_job_registry.count == 0
        drained = (drained if drained is not None else now) if idle else None
        stalled = drained is not None and now - max(drained, last[1]) > STALL_S
        if summarised >= n:
            marks["all_summaries"] = round(now, 3)
            return marks, usage
        if stalled and drained is not None:  # the rest will not come: `_check` says why
            marks["summary_queue_drained"] = round(drained, 3)
            return marks, usage
        if now > SAVE_TIMEOUT_S + SUMMARY_TIMEOUT_S:
            marks["summaries_timed_out"] = round(now, 3)
            return marks, usage
        time.sleep(POLL_SECONDS)


def _summary_jobs(client: redis.Redis) -> dict[str, int]:
    """How many summary jobs returned what ("skipped": the job found no such session)."""
    ids = [
        k.decode().split(":", 2)[2]
        for k in client.scan_iter(match="rq:job:summarize-*", count=1000)
        if k.count(b":") == 2
    ]
    jobs = [j for j in Job.fetch_many(ids, connection=client) if j is not None]
    return dict(collections.Counter(str(j.return_value()) for j in jobs))


def _idle_jobs(client: redis.Redis, due: float) -> dict[str, Any]:
    """Every idle job, from its hash: when the scheduler released it (relative to the
    deadline), how long it waited in the queue, and how long it ran."""
    ids = [k for k in client.scan_iter(match="rq:job:idle-*", count=1000) if k.count(b":") == 2]
    pipe = client.pipeline(transaction=False)
    for k in ids:
        pipe.hmget(k, "enqueued_at", "started_at", "ended_at", "status")
    released, waited, ran, statuses, early = [], [], [], collections.Counter[str](), 0
    for enq, start, end, status in pipe.execute():
        statuses[(status or b"?").decode()] += 1
        if not (enq and start and end):
            continue
        e, s, f = (utcparse(x.decode()).timestamp() for x in (enq, start, end))
        released.append(e - due)
        waited.append(s - e)
        ran.append(f - s)
        early += s < due
    ordered = sorted(released)
    passes = 1 + sum(b - a > 0.5 for a, b in itertools.pairwise(ordered)) if ordered else 0
    return {
        "created": len(ids),
        "statuses": dict(statuses),
        "checks_before_deadline": early,
        "scheduler_passes": passes,
        "released_after_deadline_s": _spread(released),
        "queue_wait_s": _spread(waited),
        "run_ms": _spread(ran, 1000),
    }


def _check(
    conn: psycopg.Connection[TupleRow], client: redis.Redis, n: int, groups: Sequence[Group]
) -> dict[str, Any]:
    """Exactly one auto-save and clear per conversation, nothing left armed or failed."""
    kinds: dict[str, int] = dict(
        conn.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall()
    )
    twice = int(
        conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE auto"
            " GROUP BY agent, channel HAVING count(*) > 1) d"
        ).fetchone()[0]  # type: ignore[index]
    )
    dead = deadletters.count(client, SHARDS)
    failed = {q: int(FailedJobRegistry(q, connection=client).count) for q in (IDLE, SUMMARIES)}
    expected = {"message.v1": n, "save.v1": n, "clear.v1": n}
    wrong = {k: kinds.get(k, 0) for k, v in expected.items() if kinds.get(k, 0) != v}
    if wrong or twice or dead or any(failed.values()):
        raise BenchError(
            f"expected {n:,} of each of {sorted(expected)}, no duplicates, dead letters or "
            f"failed jobs; got {wrong or 'those'}, {twice} conversations saved twice, "
            f"{dead} dead letters, failed jobs {failed}\n" + _logs(groups)
        )
    out = {
        "summaries_landed": kinds.get("summary.v1", 0),
        "summary_jobs": _summary_jobs(client),
        "events_by_kind": kinds,
        "conversations_saved_twice": twice,
        "dead_letters": dead,
        "failed_jobs": failed,
        "timers_left": _count_keys(client, TIMERS),
        "scheduled_left": _scheduled(client),
        # Processes log at `warning`: every line is worth a look.
        "log_lines": {g.name: len(g.lines()) for g in groups},
        "log_excerpt": {g.name: g.lines()[:5] for g in groups if g.lines()},
    }
    return out


# -- the limit: RQ SimpleWorkers running no-op jobs ---------------------------------------


@dataclass(frozen=True)
class Limit:
    """W SimpleWorkers draining N no-op jobs."""

    jobs: int  # timed: all but each worker's first (it imports this module)
    seconds: float  # from the first timed job's start to the last job's end
    wall_seconds: float  # workers' start to their exit (burst mode), start-up included


def _noop_limit(env: BenchEnv, n: int) -> Limit:
    """Queue N no-op jobs (result_ttl as the idle jobs'), then time W burst SimpleWorkers."""
    _reset(env)
    client = redis.Redis.from_url(env.redis_url)
    try:
        queue = Queue(NOOP_QUEUE, connection=client)
        for start in range(0, n, FILL_BATCH):
            pipe = client.pipeline()
            data = [
                Queue.prepare_data(noop, result_ttl=600) for _ in range(min(FILL_BATCH, n - start))
            ]
            queue.enqueue_many(data, pipeline=pipe)
            pipe.execute()
        argv = python_module(
            "rq.cli", "worker", "--burst", "--worker-class", "rq.SimpleWorker",
            "--url", env.redis_url, "--logging_level", "WARNING", NOOP_QUEUE,
        )  # fmt: skip
        print(f"  limit: {WORKERS} RQ SimpleWorkers on {n:,} no-op jobs ...", flush=True)
        started = time.perf_counter()
        groups = [Group(f"rq SimpleWorker {i}", argv, env.process_env()) for i in range(WORKERS)]
        try:
            for g in groups:
                g.proc.wait(60 + n / 50)
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"no-op workers still running:\n{_logs(groups)}") from e
        finally:
            statuses = stop(groups)
        wall = time.perf_counter() - started
        done = int(FinishedJobRegistry(NOOP_QUEUE, connection=client).count)
        if done != n or any(statuses.values()):
            raise BenchError(f"{done:,} of {n:,} no-op jobs finished; exits {statuses}")
        timed, span = _span(client, queue.finished_job_registry.get_job_ids())
    finally:
        client.close()
    print(f"  limit: {timed / span:,.0f} jobs/s ({span:.2f}s; {wall:.2f}s with start-up)")
    return Limit(timed, span, wall)


def _span(client: redis.Redis, ids: Sequence[str]) -> tuple[int, float]:
    """How many jobs ran, and for how long, leaving out each worker's first job: it
    imports the job's module, which a contextlog worker does before its first job."""
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(f"rq:job:{job_id}", "started_at", "ended_at", "worker_name")
    by_worker: dict[bytes, list[tuple[float, float]]] = collections.defaultdict(list)
    for start, end, name in pipe.execute():
        by_worker[name].append(
            (utcparse(start.decode()).timestamp(), utcparse(end.decode()).timestamp())
        )
    timed = [t for runs in by_worker.values() for t in sorted(runs)[1:]]
    return len(timed), max(e for _, e in timed) - min(s for s, _ in timed)


# -- the result ----------------------------------------------------------------------------


def _result(fired: Fired, limits: list[Limit], cost: Cost, load: list[float]) -> Result:
    n, d = fired.conversations, fired.delays
    limit = min(limits, key=lambda x: x.seconds)
    ours, noop_rate = n / max(d), limit.jobs / limit.seconds
    on = cost.with_timers
    return Result(
        name="idle",
        unit="jobs/s",  # ours: idle checks that saved (one job each) per second
        ours=ours,
        limit=noop_rate,
        limit_label=f"{WORKERS} RQ SimpleWorkers (`rq worker --burst`) draining {n:,} queued "
        "no-op jobs (a function of tests/bench/idle.py), timed from the first job's start to "
        f"the last one's end ({limit.seconds:.2f} s), each worker's first job (it imports the "
        "module) left out; the faster of a run before and one after part 1",
        target=TARGET_RATIO,
        extra=(
            f"{n:,} idle at once: p50 {_pct(d, 0.5):.1f} s, p99 {_pct(d, 0.99):.1f} s, max "
            f"{max(d):.1f} s past the deadline, {fired.checks['summaries_landed']:,} summaries; "
            f"{cost.calls / cost.messages:.3f} timer Redis calls/message, "
            f"{on.jobs / LOAD_CONVERSATIONS:.2f} RQ jobs/conversation over {cost.messages:,} "
            "messages"
        ),
        description=(
            f"Part 1: {n:,} conversations with a {IDLE_TIMEOUT} s idle timeout get one message "
            "each, all with the same `occurred_at`, through a running `contextlog ingest`; "
            f"{WORKERS} `contextlog worker` processes (queues `idle` and `summaries`, one with "
            "RQ's scheduler) auto-save them. Delay = the auto session's `created_at` (the "
            "idle job's clock) minus the deadline; ours = conversations saved per second from "
            "the deadline to the last save. Part 2: a fresh ingest drains "
            f"{cost.messages:,} messages over {LOAD_CONVERSATIONS:,} conversations, once with "
            f"{LOAD_IDLE_TIMEOUT // 60} min idle timeouts and once with them off; the timers' "
            "Redis calls are the difference in INFO commandstats."
        ),
        notes=_notes(fired, limits, cost),
        details={
            "conversations": n,
            "workers": WORKERS,
            "idle_timeout_s": IDLE_TIMEOUT,
            "scheduler_worker": fired.scheduler,
            "push_seconds": round(fired.push_seconds, 3),
            "armed_seconds": round(fired.armed_seconds, 3),
            "delay_past_deadline_s": _spread(d),
            "marks_after_deadline_s": fired.marks,
            "idle_jobs": fired.jobs,
            "cpu_deadline_to_last_session": fired.cpu,
            **fired.checks,
            "limit_runs": [
                dataclasses.asdict(x) | {"jobs_per_s": round(x.jobs / x.seconds, 1)} for x in limits
            ],
            "timer_cost": dataclasses.asdict(cost)
            | {
                "calls_per_message": round(cost.calls / cost.messages, 4),
                "jobs_per_conversation": on.jobs / LOAD_CONVERSATIONS,
                "batch_size": DEFAULT_BATCH_SIZE,
            },
            "load_average_at_start": load,
        },
    )


def _notes(fired: Fired, limits: list[Limit], cost: Cost) -> list[str]:
    n, d, jobs, marks = fired.conversations, fired.delays, fired.jobs, fired.marks
    limit = min(limits, key=lambda x: x.seconds)
    ours, noop_rate = n / max(d), limit.jobs / limit.seconds
    on, off = cost.with_timers, cost.without
    calls = ", ".join(f"{k} {cost.diff[k]:,}" for k in SCRIPT_CALLS if k in cost.diff)
    return [
        f"Delay past the deadline: p50 {_pct(d, 0.5):.2f} s, p99 {_pct(d, 0.99):.2f} s, max "
        f"{max(d):.2f} s (min {min(d):.2f} s). Seconds after the deadline (wall clock, rows "
        "stored): "
        + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in marks.items())
        + f". Timers were armed {fired.armed_seconds:.2f} s after the messages' occurred_at "
        f"(push {fired.push_seconds:.2f} s).",
        f"Idle jobs: {jobs['created']:,} for {n:,} conversations (one delayed job per "
        f"second of deadlines, which hands its conversations out in parts of {PART} to jobs "
        f"queued at once), {jobs['checks_before_deadline']:,} of them started before the "
        "deadline. RQ's scheduler released them in "
        f"{jobs['scheduler_passes']} passes (RQ moves at most 1,000 jobs a pass and sleeps 1 s "
        f"between passes), the last {jobs['released_after_deadline_s'].get('max', 0):.2f} s "
        f"after the deadline; queue wait p50 {jobs['queue_wait_s'].get('p50', 0):.2f} s, p99 "
        f"{jobs['queue_wait_s'].get('p99', 0):.2f} s; run p50 "
        f"{jobs['run_ms'].get('p50', 0):.1f} ms.",
        "Summaries: every auto-save queues one on `summaries`, run by the same workers after "
        f"the `idle` queue (local summarizer, no API key): {fired.checks['summaries_landed']:,} "
        f"of {n:,} landed; the jobs returned {fired.checks['summary_jobs']}.",
        "Limit: no-op jobs/s before and after part 1: "
        + " and ".join(
            f"{x.jobs / x.seconds:,.0f} ({x.wall_seconds:.1f} s with start-up)" for x in limits
        )
        + f"; the faster counts. Idle saves {ours:,.0f}/s, ratio {ours / noop_rate:.2f}. "
        f"CPU from the deadline to the last session stored: {_cpu_line(fired.cpu)}.",
        f"Timers during {cost.messages:,} messages: {cost.calls:,} Redis calls "
        f"({cost.calls / cost.messages:.3f} per message: {calls}) and {cost.inside:,} commands "
        f"run inside the scripts; {on.jobs:,} RQ jobs scheduled "
        f"({on.jobs / LOAD_CONVERSATIONS:.2f} per conversation), one script call each. Ingest "
        f"(batch size {DEFAULT_BATCH_SIZE:,}, the default) stored the messages in "
        f"{on.transactions:,} transactions with ~{on.touches / max(1, on.transactions):.0f} "
        f"conversations each ({on.touches:,} conversation-batches). Other commands differed "
        f"by {cost.noise:,} (pair {cost.attempts} of at most {DRAIN_ATTEMPTS}; clients of "
        f"other dbs active: { {**off.others, **on.others} or 'none' }).",
        f"Part 2 ingest: {cost.messages / on.seconds:,.0f} messages/s with timers, "
        f"{cost.messages / off.seconds:,.0f} without (process start-up included). Processes "
        "log at `warning`; their stderr lines: "
        + ", ".join(f"{k} {v}" for k, v in fired.checks["log_lines"].items())
        + ".",
    ]
