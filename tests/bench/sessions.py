"""Benchmark "sessions": 1,000 sessions saved at once, summarised by RQ workers against a
fake Messages API that answers every request after 200 ms.

Phase A pushes 1,000 `save` events in one pipeline to a running `contextlog ingest` and W
`contextlog worker` processes, and times them until every session has its summary in
Postgres, beside the ideal of W workers each doing nothing but wait out the API:
sessions x latency / W (1,000 x 0.2 s / 8 = 25 s, i.e. 40 sessions/s).

Phase B times the same running ingest draining a backlog of plain messages, first with
the workers idle, then while they produce the summaries of another 1,000 saves pushed
just before the messages. The backlog appears at once: ingest is paused (SIGSTOP) while
it is pushed and resumed (SIGCONT) when the clock starts, so the push does not compete
with it for the CPU and no start-up is timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies
import psycopg
import redis
from psycopg.rows import TupleRow
from rq import Worker
from rq.registry import FailedJobRegistry

from contextlog.producers import Batch, Producer
from contextlog.producers.commands import Prepared
from contextlog.schema import keys
from contextlog.schema.queries import query
from contextlog.worker.ingest import deadletters
from contextlog.worker.tasks.queue import SUMMARIES
from contextlog.worker.tasks.timers import IDLE
from tests.bench.harness import (
    STOP_TIMEOUT,
    BenchEnv,
    BenchError,
    CpuMeter,
    Result,
    Watched,
    is_local,
    python_module,
    redis_cpu,
)
from tests.bench.workload import Traffic
from tests.support.fake_anthropic import FakeAPIServer

SESSIONS = 1000
SEED_MESSAGES = 4  # per conversation: every save has a window to snapshot
# A job is ~200 ms of waiting on the API for a few ms of CPU, so workers can outnumber
# the 2 cores of the reference machine: 8 keep 8 requests in flight for ~110 MB of RSS
# each. More would mostly measure how 2 cores share RQ's per-job work.
WORKERS = 8
LATENCY = 0.2  # seconds the fake API takes per request
SHARDS = 4
LOAD_MESSAGES = 100_000  # phase B's backlog (--events changes it)
LOAD_CONVERSATIONS = 1000
# An untimed first drain: the load's conversations get their rows and idle timers (a
# delayed RQ job each) before the timed drains, which then do the same kind of work.
WARM_MESSAGES = 10_000
FILL_BATCH = 1000  # events per producer pipeline
POLL_SECONDS = 0.05
START_TIMEOUT = 60.0  # seconds for ingest to store the seed and the workers to register
TARGET_RATIO = 0.8
AGENT = "support-bot"
SOURCE = "discord"  # the adapter told about saves and summaries (nobody reads it here)
MB = 2**20

COUNTS = """SELECT count(*),
                   count(*) FILTER (WHERE summary IS NOT NULL AND NOT summary_failed),
                   count(*) FILTER (WHERE summary_failed)
            FROM sessions"""


@dataclass
class Rig:
    """The running system: fake API, ingest, workers, and the bench's own clients."""

    env: BenchEnv
    api: FakeAPIServer
    producer: Producer
    client: redis.Redis
    conn: psycopg.Connection[TupleRow]  # autocommit, for polling
    ingest: Watched | None = None
    workers: list[Watched] = field(default_factory=list)
    stopped: dict[str, int] | None = None  # exit statuses, once stopped

    @property
    def processes(self) -> list[Watched]:
        """Every contextlog process started so far."""
        return ([self.ingest] if self.ingest else []) + self.workers

    def sample(self) -> None:
        """Record RSS; fails with its stderr if a process died."""
        for p in self.processes:
            p.sample()

    def counts(self) -> tuple[int, int, int]:
        """Sessions, sessions with a summary, sessions whose summary failed."""
        row = self.conn.execute(COUNTS).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def redis_commands(self) -> int:
        """Commands the Redis server has processed (all clients, since it started)."""
        return int(self.client.info("stats")["total_commands_processed"])

    def meter(self) -> CpuMeter:
        """CPU of ingest, the workers, Redis, Postgres backends and this process (the API)."""
        cpu = CpuMeter()
        if self.ingest:
            cpu.watch("ingest", self.ingest.proc.pid)
        for w in self.workers:
            cpu.watch("workers", w.proc.pid)
        cpu.watch("bench_and_fake_api", os.getpid())
        cpu.watch_counter("redis_server", redis_cpu(self.env.redis_url))
        cpu.watch_counter("other_programs", _OtherPrograms(self).cpu_seconds)
        if is_local(self.env.database_url):
            rows = self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
            for (pid,) in rows:
                cpu.watch("postgres_backends", int(pid))
        return cpu


class _OtherPrograms:
    """CPU seconds used since creation by processes that are not this benchmark's, its
    servers' (Postgres, Redis) or their children: on a shared machine, the competition.
    Processes that start and exit in between are missed."""

    def __init__(self, rig: Rig) -> None:
        mine = {os.getpid(), *(p.proc.pid for p in rig.processes)}
        self._mine = mine
        self._start = self._snapshot()

    def _snapshot(self) -> dict[int, float]:
        out = {}
        for ps in psutil.process_iter(["name", "ppid", "cpu_times"]):
            info = ps.info
            if info["cpu_times"] is None or info["name"] in ("postgres", "redis-server"):
                continue
            if ps.pid in self._mine or info["ppid"] in self._mine:
                continue
            out[ps.pid] = float(info["cpu_times"].user + info["cpu_times"].system)
        return out

    def cpu_seconds(self) -> float:
        """Seconds since creation (a counter read twice by CpuMeter: 0, then the total)."""
        now = self._snapshot()
        return sum(max(0.0, used - self._start.get(pid, 0.0)) for pid, used in now.items())


@dataclass(frozen=True)
class Landing:
    """One round of 1,000 saves: when their sessions and summaries were stored."""

    seconds: float  # from the push (or the backlog's release) to the last summary
    marks: dict[str, float]  # seconds to: all sessions stored, first summary, 10/50/90%
    api_requests: int
    failed: int
    redis_commands: int  # by every client of the server (any db), push to last summary
    cpu: dict[str, float]


@dataclass(frozen=True)
class Drain:
    """One timed drain of the message backlog by the running ingest."""

    messages: int
    events: int  # messages, plus the saves of the busy run
    released: float  # perf_counter() when ingest was resumed: the clock's 0
    requests_at_release: int  # fake API requests served by then
    seconds: float
    push_seconds: float  # while ingest was paused, not timed
    summaries_during: int  # summaries stored while the backlog drained
    api_requests_during: int
    cpu: dict[str, float]

    @property
    def rate(self) -> float:
        """Message events stored per second."""
        return self.messages / self.seconds


def run(env: BenchEnv) -> Result:
    """Phase A (1,000 summaries against the ideal), then phase B (ingest alone and busy)."""
    count = env.events or LOAD_MESSAGES
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    with contextlib.ExitStack() as stack:
        rig = _start(env, stack)
        a = _phase_a(rig)
        traffic = Traffic(LOAD_CONVERSATIONS)
        warm = _drain(rig, _prepare(rig.producer, traffic, WARM_MESSAGES), "warm-up")
        alone = _drain(rig, _prepare(rig.producer, traffic, count), "alone")
        busy = _drain(rig, _prepare(rig.producer, traffic, count), "while summarising")
        second = _await_summaries(rig, SESSIONS, busy.released, busy.requests_at_release)
        checks = _check(rig, SESSIONS * SEED_MESSAGES + WARM_MESSAGES + 2 * count)
        checks["warm_up_drain"] = _rounded(warm, "released", "requests_at_release")
        checks["peak_rss_mb"] = _peaks(rig)
        checks["exit_statuses"] = _stop_all(rig)
    checks["load_average_at_start"] = load_at_start
    return _result(a, alone, busy, second, checks)


# -- set-up ------------------------------------------------------------------------------


def _process_env(env: BenchEnv, api_url: str) -> dict[str, str]:
    return env.process_env(
        CONTEXTLOG_LOG_LEVEL="warning",
        CONTEXTLOG_SHARDS=str(SHARDS),
        ANTHROPIC_API_KEY="fake",
        ANTHROPIC_BASE_URL=api_url,
    )


def _start(env: BenchEnv, stack: contextlib.ExitStack) -> Rig:
    """Fake API, seeded conversations, ingest (waited for), then W registered workers."""
    api = stack.enter_context(FakeAPIServer(latency=LATENCY))
    client = redis.Redis.from_url(env.redis_url)
    stack.callback(client.close)
    producer = Producer.from_url(env.redis_url, shards=SHARDS)
    stack.callback(producer.close)
    conn = stack.enter_context(psycopg.connect(env.database_url, autocommit=True))
    rig = Rig(env, api, producer, client, conn)
    _seed(producer)
    penv = _process_env(env, api.url)
    print(f"  starting ingest and {WORKERS} workers (fake API at {api.url}) ...", flush=True)
    rig.ingest = stack.enter_context(
        Watched("contextlog ingest", python_module("contextlog.worker.cli.main", "ingest"), penv)
    )
    argv = python_module("contextlog.worker.cli.main", "worker")
    for i in range(WORKERS):
        rig.workers.append(stack.enter_context(Watched(f"contextlog worker {i}", argv, penv)))
    stack.callback(_terminate, rig)  # runs first: every process gets SIGTERM at once
    _wait_ready(rig, SESSIONS * SEED_MESSAGES)
    return rig


def _conversation(i: int) -> str:
    return f"{SOURCE}:guild-{i % 37}:sessions-{i:04d}"


def _seed(producer: Producer) -> None:
    """Four messages in each of the 1,000 conversations that will be saved."""
    lines = (
        "Conversation {i}: the nightly deploy of build {i} failed with a config error.",
        "The config loader rejects the REDIS_URL of build {i}: it lacks the redis:// scheme.",
        "Fixed it. Can you write the migration notes for build {i} before Friday?",
        "Drafted the notes for build {i}; the rollback section still needs a review.",
    )
    for start in range(0, SESSIONS, FILL_BATCH // SEED_MESSAGES):
        with producer.batch() as b:
            for i in range(start, min(SESSIONS, start + FILL_BATCH // SEED_MESSAGES)):
                for turn, text in enumerate(lines):
                    role = "user" if turn % 2 == 0 else "assistant"
                    b.post_message(AGENT, _conversation(i), role, text.format(i=i), source=SOURCE)


def _wait_ready(rig: Rig, seeded: int) -> None:
    """Until ingest has stored the seed and every worker has registered with RQ."""
    deadline = time.perf_counter() + START_TIMEOUT
    while True:
        rig.sample()
        stored = int(rig.conn.execute(query("events_stored")).fetchone()[0])  # type: ignore[index]
        workers = Worker.count(connection=rig.client)
        if stored >= seeded and workers >= WORKERS:
            print(f"  {seeded:,} seed messages stored, {workers} workers registered", flush=True)
            return
        if time.perf_counter() > deadline:
            raise BenchError(
                f"after {START_TIMEOUT:.0f}s: {stored:,} of {seeded:,} seed events stored, "
                f"{workers} of {WORKERS} workers registered"
            )
        time.sleep(POLL_SECONDS)


# -- phase A: the summaries ---------------------------------------------------------------


def _push_saves(producer: Producer, label: str) -> float:
    """One `save` per seeded conversation, all in one pipeline; returns the push's seconds."""
    started = time.perf_counter()
    with producer.batch() as b:
        for i in range(SESSIONS):
            b.save(AGENT, _conversation(i), f"{label} {i}", source=SOURCE)
    return time.perf_counter() - started


def _phase_a(rig: Rig) -> Landing:
    ideal = SESSIONS * LATENCY / WORKERS
    print(f"  pushing {SESSIONS:,} saves at once (ideal {ideal:.1f}s) ...", flush=True)
    requests, started = rig.api.requests_served, time.perf_counter()
    _push_saves(rig.producer, "before the release")
    landing = _await_summaries(rig, 0, started, requests)
    if landing.api_requests < SESSIONS:
        raise BenchError(f"the fake API served {landing.api_requests} requests for {SESSIONS}")
    print(
        f"  {SESSIONS:,} summaries in {landing.seconds:.2f}s "
        f"({SESSIONS / landing.seconds:.1f} sessions/s; ideal {ideal:.1f}s); CPU "
        + _cpu_line(landing.cpu),
        flush=True,
    )
    return landing


def _await_summaries(rig: Rig, base: int, started: float, requests: int) -> Landing:
    """Poll until `base` + 1,000 sessions have a summary; `started` is the clock's 0 and
    `requests` the fake API's count then."""
    cpu, commands = rig.meter(), rig.redis_commands()
    timeout = 60 + 10 * SESSIONS * LATENCY / WORKERS
    marks: dict[str, float] = {}
    goals = {"10%": 0.1, "50%": 0.5, "90%": 0.9}
    while True:
        rig.sample()
        total, done, failed = rig.counts()
        elapsed = time.perf_counter() - started
        made = done - base
        if total - base >= SESSIONS:
            marks.setdefault("all_sessions_stored", elapsed)
        if made > 0:
            marks.setdefault("first_summary", elapsed)
        for name, share in goals.items():
            if made >= share * SESSIONS:
                marks.setdefault(name, elapsed)
        if made + failed >= SESSIONS:
            break
        if elapsed > timeout:
            raise BenchError(
                f"after {elapsed:.0f}s: {total - base} of {SESSIONS} sessions stored, {made} "
                f"summaries, {failed} failed; {rig.api.requests_served - requests} API "
                f"requests served; {_failed_jobs(rig)} failed RQ jobs\n{_logs(rig)}"
            )
        time.sleep(POLL_SECONDS)
    if failed:
        raise BenchError(f"{failed} summaries failed (placeholder stored)\n{_logs(rig)}")
    served = rig.api.requests_served - requests
    return Landing(elapsed, marks, served, failed, rig.redis_commands() - commands, cpu.report())


# -- phase B: ingest with and without summary work --------------------------------------


def _prepare(producer: Producer, traffic: Traffic, count: int) -> list[Prepared]:
    """`count` messages encoded ahead, so the push is only XADDs.

    They are stamped now, not with the workload's clock of two days ago: with that, every
    conversation's idle timer (30 min after its last message) would be long past, and the
    workers would run an idle check and an auto-save per conversation during the drain,
    work that live traffic only causes 30 minutes after it stops.
    """
    b = Batch(producer.encoder, producer.clock)
    for m in traffic.messages(count):
        b.post_message(**{**dataclasses.asdict(m), "occurred_at": None})
    return b.prepared


@contextlib.contextmanager
def _paused(p: Watched) -> Iterator[None]:
    """Ingest stopped (SIGSTOP) for the block; resumed even if the block fails."""
    p.proc.send_signal(signal.SIGSTOP)
    ps = psutil.Process(p.proc.pid)
    deadline = time.perf_counter() + 5
    while ps.status() != psutil.STATUS_STOPPED and time.perf_counter() < deadline:
        time.sleep(0.005)
    try:
        yield
    finally:
        p.proc.send_signal(signal.SIGCONT)


def _stream_ends(client: redis.Redis) -> dict[int, tuple[int, int]]:
    """Each shard stream's last entry id."""
    ends = {}
    for shard in range(SHARDS):
        last: Any = client.xrevrange(keys.stream(shard), count=1)
        if last:
            ends[shard] = _entry_id(last[0][0])
    return ends


def _entry_id(raw: bytes | str) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _caught_up(rig: Rig, ends: dict[int, tuple[int, int]]) -> bool:
    """Whether every shard's checkpoint has passed its stream's last entry (as pushed)."""
    done = {int(r[0]): _entry_id(r[2]) for r in rig.conn.execute(query("checkpoints"))}
    return all(done.get(s, (0, 0)) >= end for s, end in ends.items())


def _drain(rig: Rig, messages: list[Prepared], label: str) -> Drain:
    """Push the backlog while ingest is paused, resume it and time until it is stored;
    "while summarising" pushes 1,000 saves first."""
    with_saves = label == "while summarising"
    print(f"  ingest {label}: pushing {len(messages):,} messages ...", flush=True)
    assert rig.ingest is not None
    _, done_before, _ = rig.counts()
    with _paused(rig.ingest):
        pushed = time.perf_counter()
        if with_saves:
            _push_saves(rig.producer, "under load")
        for i in range(0, len(messages), FILL_BATCH):
            rig.producer.send_prepared(messages[i : i + FILL_BATCH])
        push_seconds = time.perf_counter() - pushed
        ends = _stream_ends(rig.client)
        cpu, requests = rig.meter(), rig.api.requests_served
        started = time.perf_counter()  # SIGCONT follows at once
    timeout = 60 + len(messages) / 500
    while not _caught_up(rig, ends):
        rig.sample()
        if time.perf_counter() - started > timeout:
            raise BenchError(f"ingest did not drain {len(messages):,} messages in {timeout:.0f}s")
        time.sleep(POLL_SECONDS)
    seconds = time.perf_counter() - started
    _, done_after, _ = rig.counts()
    drain = Drain(
        messages=len(messages),
        events=len(messages) + (SESSIONS if with_saves else 0),
        released=started,
        requests_at_release=requests,
        seconds=seconds,
        push_seconds=push_seconds,
        summaries_during=done_after - done_before,
        api_requests_during=rig.api.requests_served - requests,
        cpu=cpu.report(),
    )
    print(
        f"  ingest {label}: {drain.rate:,.0f} messages/s ({seconds:.2f}s; "
        f"{drain.summaries_during} summaries stored meanwhile); CPU {_cpu_line(drain.cpu)}",
        flush=True,
    )
    return drain


# -- checks and tear-down ---------------------------------------------------------------


def _check(rig: Rig, messages: int) -> dict[str, Any]:
    """Every message stored once, every summary once, no dead letters or failed jobs."""
    row = rig.conn.execute(
        "SELECT count(*) FILTER (WHERE kind = 'message.v1'),"
        " count(*) FILTER (WHERE kind = 'summary.v1'),"
        " count(*) FILTER (WHERE kind = 'compaction.v1') FROM events"
    ).fetchone()
    assert row is not None
    stored, summaries, compactions = (int(x) for x in row)
    dead = deadletters.count(rig.client, SHARDS)
    failed_jobs = _failed_jobs(rig)
    if stored != messages or dead or failed_jobs or summaries != 2 * SESSIONS:
        raise BenchError(
            f"expected {messages:,} messages and {2 * SESSIONS} summary events, no dead letters "
            f"or failed jobs; got {stored:,}, {summaries}, {dead} dead letters, "
            f"{failed_jobs} failed jobs\n{_logs(rig)}"
        )
    return {
        "messages_stored": stored,
        "summary_events": summaries,
        "compaction_events": compactions,
        "dead_letters": dead,
        "failed_jobs": failed_jobs,
        "api_requests_total": rig.api.requests_served,
        "stderr_tails": {p.name: p.stderr_tail(5) for p in rig.processes if p.stderr_tail(5)},
    }


def _failed_jobs(rig: Rig) -> int:
    """Failed jobs on both of the workers' queues."""
    return sum(FailedJobRegistry(q, connection=rig.client).count for q in (SUMMARIES, IDLE))


def _logs(rig: Rig) -> str:
    """The stderr tails of the processes that wrote any."""
    tails = [(p.name, p.stderr_tail(10)) for p in rig.processes]
    return "\n".join(f"--- {name}:\n{tail}" for name, tail in tails if tail.strip())


def _peaks(rig: Rig) -> dict[str, float]:
    workers = max((w.high_water_mark() for w in rig.workers), default=0)
    ingest = rig.ingest.high_water_mark() if rig.ingest else 0
    return {"ingest": round(ingest / MB, 1), "worker_max": round(workers / MB, 1)}


def _terminate(rig: Rig) -> dict[str, int]:
    """SIGTERM to every process at once (RQ workers finish their job and exit), then wait;
    what is still running after `STOP_TIMEOUT` is killed. Returns the exit statuses."""
    if rig.stopped is not None:
        return rig.stopped
    running = [p for p in rig.processes if p.proc.poll() is None]
    for p in running:
        p.proc.send_signal(signal.SIGCONT)  # in case a failure left ingest paused
        p.proc.send_signal(signal.SIGTERM)
    deadline = time.perf_counter() + STOP_TIMEOUT
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.proc.wait(max(0.1, deadline - time.perf_counter()))
    rig.stopped = {p.name: p.stop() for p in rig.processes}  # stop() kills what is left
    return rig.stopped


def _stop_all(rig: Rig) -> dict[str, int]:
    """Stop every process; fails if one did not exit cleanly on SIGTERM."""
    statuses = _terminate(rig)
    if bad := {name: s for name, s in statuses.items() if s != 0}:
        raise BenchError(f"processes exited badly after SIGTERM: {bad}\n{_logs(rig)}")
    return statuses


# -- the result ----------------------------------------------------------------------


def _cpu_line(usage: dict[str, float]) -> str:
    """`ingest 6.5s, ...; machine busy 14.4s (2.1s unattributed) of 2 cores x 9.6s`; the
    unattributed part is Postgres's background processes, the workers' RQ scheduler child
    and programs that came and went during the phase."""
    named = {
        k.removesuffix("_cpu_seconds"): v
        for k, v in usage.items()
        if k.endswith("_cpu_seconds") and not k.startswith("machine")
    }
    busy = usage["machine_busy_cpu_seconds"]
    return (
        ", ".join(f"{k} {v:.1f}s" for k, v in named.items())
        + f"; machine busy {busy:.1f}s ({busy - sum(named.values()):.1f}s unattributed) "
        f"of {usage['cores']:.0f} cores x {usage['wall_seconds']:.1f}s"
    )


def _per_job_ms(usage: dict[str, float], name: str) -> float:
    return round(1000 * usage.get(f"{name}_cpu_seconds", 0.0) / SESSIONS, 2)


def _rounded(x: object, *drop: str) -> dict[str, Any]:
    """A result record as JSON: floats to the millisecond, bookkeeping fields left out."""
    fields = dataclasses.asdict(x)  # type: ignore[call-overload]
    return {
        k: round(v, 3) if isinstance(v, float) else v for k, v in fields.items() if k not in drop
    }


def _result(
    a: Landing, alone: Drain, busy: Drain, second: Landing, checks: dict[str, Any]
) -> Result:
    ideal = SESSIONS * LATENCY / WORKERS
    # Time a worker slot spends per job beyond the API's latency, if all W were kept busy.
    overhead_ms = 1000 * (a.seconds * WORKERS / SESSIONS - LATENCY)
    slowdown = busy.rate / alone.rate
    per_job = {n: _per_job_ms(a.cpu, n) for n in ("workers", "redis_server", "ingest")}
    return Result(
        name="sessions",
        unit="sessions/s",
        ours=SESSIONS / a.seconds,
        limit=WORKERS / LATENCY,
        limit_label=f"{WORKERS} workers each waiting out one {LATENCY * 1000:.0f} ms API call "
        f"per session and nothing else: {SESSIONS:,} x {LATENCY} s / {WORKERS} = {ideal:.0f} s",
        target=TARGET_RATIO,
        extra=(
            f"{SESSIONS:,} summaries in {a.seconds:.1f} s (ideal {ideal:.0f} s, {WORKERS} "
            f"workers); ingest {alone.rate:,.0f} msg/s alone, {busy.rate:,.0f} while "
            f"summarising ({slowdown:.2f}x)"
        ),
        description=(
            f"{SESSIONS:,} conversations of {SEED_MESSAGES} messages saved at once (one "
            f"pipeline of `save` events) with a running `contextlog ingest` and {WORKERS} "
            "`contextlog worker` processes (RQ SimpleWorkers) whose summaries go to a fake "
            f"Messages API answering in {LATENCY * 1000:.0f} ms "
            "(`tests/support/fake_anthropic.FakeAPIServer`); timed from the push until every "
            "session has a summary in Postgres. Then the same ingest drains a backlog of "
            f"{alone.messages:,} messages ({LOAD_CONVERSATIONS:,} conversations), once with the "
            f"workers idle and once while they summarise another {SESSIONS:,} saves pushed just "
            "before the messages."
        ),
        notes=[
            f"Summaries: {a.seconds:.2f} s; seconds after the push to "
            + ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in a.marks.items())
            + f". {a.api_requests:,} fake API requests, {a.failed} failed. A worker slot "
            f"spent {overhead_ms:.0f} ms per job beyond the API's latency; per job: CPU "
            + ", ".join(f"{k} {v} ms" for k, v in per_job.items())
            + f", {a.redis_commands / SESSIONS:.0f} Redis commands (all clients). "
            f"CPU {_cpu_line(a.cpu)}.",
            f"Ingest alone: {alone.messages:,} messages in {alone.seconds:.2f} s "
            f"({alone.rate:,.0f}/s); CPU {_cpu_line(alone.cpu)}.",
            f"Ingest while summarising: {busy.messages:,} messages and {SESSIONS:,} saves in "
            f"{busy.seconds:.2f} s ({busy.rate:,.0f} messages/s, {slowdown:.2f}x alone); "
            f"{busy.summaries_during} summaries stored meanwhile; CPU {_cpu_line(busy.cpu)}.",
            f"That round's {SESSIONS:,} summaries all landed {second.seconds:.2f} s after the "
            "backlog was released (ingest stores them behind the messages, in stream order).",
            f"Each backlog is pushed while ingest is paused (SIGSTOP; {alone.push_seconds:.1f} s "
            f"and {busy.push_seconds:.1f} s) after an untimed warm-up drain of "
            f"{WARM_MESSAGES:,} messages, then timed from SIGCONT until every shard's "
            "checkpoint passes its stream's last entry. Processes log at `warning`.",
        ],
        details={
            "sessions": SESSIONS,
            "seed_messages_per_session": SEED_MESSAGES,
            "workers": WORKERS,
            "api_latency_s": LATENCY,
            "ideal_seconds": ideal,
            "shards": SHARDS,
            "summaries": {
                **_rounded(a),
                "sessions_per_s": round(SESSIONS / a.seconds, 2),
                "overhead_ms_per_job": round(overhead_ms, 1),
                "cpu_ms_per_job": per_job,
            },
            "ingest_alone": _rounded(alone, "released", "requests_at_release"),
            "ingest_while_summarising": _rounded(busy, "released", "requests_at_release"),
            "ingest_ratio_busy_over_alone": round(slowdown, 3),
            # Polled only once the drain was over: its marks would say when polling began.
            "second_round_summaries": _rounded(second, "marks"),
            **checks,
        },
    )
