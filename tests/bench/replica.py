"""Benchmark of reads from a streaming replica (`producers/replica.py`).

A private primary and a `pg_basebackup` replica of it (tests/support/replica.py) on this
machine. Reads/s of a 1,000-message window context (`ContextReader.context()`, the whole
window returned, as in the `context` benchmark) in interleaved rounds (A B C A B C): from
the primary, from the replica through the routing reader (its lag check in the same
pipeline), and from the replica read directly (a primary-only reader pointed at it: the
check's cost is the difference). Then the reads/s of 4 client threads on the replica, and
the read-your-writes latency (`context(wait_for=...)` after XADD through a real
`contextlog ingest`) with the replica reader and with a primary-only one, interleaved.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the dev dependencies
import psycopg

from contextlog.producers import ContextReader, Producer
from contextlog.schema.defaults import ConversationDefaults
from tests.bench.context import _fill_targets, _percentiles
from tests.bench.harness import BenchEnv, BenchError, Result, Watched, python_module
from tests.support.replica import ReplicaPair
from tests.support.servers import ServerMissing

ROUNDS, PER_ROUND = 10, 40
THREADS, THREAD_SECONDS = 4, 5.0
PROBES = 20  # wait_for probes per reader per round
WINDOW = "w1000"


def _timed(reader: ContextReader, n: int) -> float:
    """Reads/s of n sequential reads of the window."""
    start = time.perf_counter()
    for _ in range(n):
        reader.context("bench", WINDOW)
    return n / (time.perf_counter() - start)


def _rounds(readers: dict[str, ContextReader]) -> dict[str, Any]:
    """Reads/s per reader per round, interleaved, and the per-round ratios' medians."""
    rates: dict[str, list[float]] = {name: [] for name in readers}
    for r in readers.values():  # warm-up: pools, caches
        for _ in range(10):
            r.context("bench", WINDOW)
    for _ in range(ROUNDS):
        for name, r in readers.items():
            rates[name].append(_timed(r, PER_ROUND))
    ratio = [a / b for a, b in zip(rates["replica"], rates["primary"], strict=True)]
    check = [a / b for a, b in zip(rates["replica"], rates["replica_direct"], strict=True)]
    return {
        "reads_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "rounds": rates,
        "median_ratio_replica_over_primary": statistics.median(ratio),
        "median_ratio_check_over_direct": statistics.median(check),
    }


def _server_cpu(pair: ReplicaPair) -> dict[int, float]:
    """CPU seconds used so far by each process of the replica server (postmaster, backends)."""
    pid = int((pair.replica.datadir / "postmaster.pid").read_text().split()[0])
    root = psutil.Process(pid)
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = float(t.user + t.system)
    return out


def _concurrent(reader: ContextReader, pair: ReplicaPair) -> dict[str, float]:
    """Reads/s of THREADS clients reading the window for THREAD_SECONDS, and the replica
    server's CPU seconds per read (its capacity: reads/s per core it is given)."""
    before = _server_cpu(pair)
    counts = [0] * THREADS
    stop = time.perf_counter() + THREAD_SECONDS

    def client(i: int) -> None:
        while time.perf_counter() < stop:
            reader.context("bench", WINDOW)
            counts[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = _server_cpu(pair)
    cpu = sum(used - before.get(pid, 0.0) for pid, used in after.items())
    reads = sum(counts)
    return {
        "reads_per_s": reads / wall,
        "server_cpu_ms_per_read": cpu / reads * 1000,
        "reads_per_s_per_server_core": reads / cpu,
    }


def _read_your_writes(env: BenchEnv, pair: ReplicaPair) -> dict[str, Any]:
    """wait_for latency (ms) via the replica reader and a primary-only reader, interleaved."""
    readers = {
        "primary": ContextReader.from_url(pair.url),
        "replica": ContextReader.from_url(pair.url, replica_url=pair.replica_url),
    }
    producer = Producer.from_url(env.redis_url, shards=4)
    samples: dict[str, list[float]] = {name: [] for name in readers}
    proc_env = {**env.process_env(CONTEXTLOG_LOG_LEVEL="warning"), "DATABASE_URL": pair.url}
    with Watched(
        "ingest", python_module("contextlog.worker.cli.main", "ingest"), proc_env
    ) as ingest:
        eid = producer.post_message("warm", "up", "user", "hello")
        for r in readers.values():
            r.context("warm", "up", wait_for=eid, timeout=30)
        for _ in range(ROUNDS):
            for name, r in readers.items():
                for _ in range(PROBES):
                    t = time.perf_counter()
                    eid = producer.post_message("probe", "general", "user", "ping")
                    r.context("probe", "general", wait_for=eid, timeout=10)
                    samples[name].append((time.perf_counter() - t) * 1000)
        ingest.stop()
    routing = readers["replica"].routing
    for r in readers.values():
        r.close()
    producer.close()
    out: dict[str, Any] = {"routing": routing}
    for name, lat in samples.items():
        p50, p99 = _percentiles(lat)
        out[name] = {"p50_ms": p50, "p99_ms": p99, "samples": len(lat)}
    return out


def _measure(env: BenchEnv, pair: ReplicaPair) -> dict[str, Any]:
    with psycopg.connect(pair.url) as conn:
        _fill_targets(conn)
    pair.caught_up()
    whole = ConversationDefaults(token_budget=10**9)
    readers = {
        "primary": ContextReader.from_url(pair.url, defaults=whole),
        "replica": ContextReader.from_url(pair.url, replica_url=pair.replica_url, defaults=whole),
        "replica_direct": ContextReader.from_url(pair.replica_url, defaults=whole),
    }
    try:
        n = len(readers["replica"].context("bench", WINDOW).messages)
        if n != 1000:
            raise BenchError(f"the window holds {n} messages, not 1,000")
        sequential = _rounds(readers)
        print(f"  sequential: {sequential['reads_per_s']}", flush=True)
        concurrent = _concurrent(readers["replica"], pair)
        routing = readers["replica"].routing
    finally:
        for r in readers.values():
            r.close()
    if routing["primary"]:
        raise BenchError(f"the primary served reads meant for the replica: {routing}")
    ryw = _read_your_writes(env, pair)
    print(f"  read your writes: {ryw}", flush=True)
    return {"sequential": sequential, "concurrent": concurrent, "wait_for": ryw}


def run(env: BenchEnv) -> Result:
    """Replica reads against primary reads, on a private primary + replica pair."""
    try:
        pair = ReplicaPair.start_new()
    except ServerMissing as e:
        raise BenchError(f"cannot start a primary + replica pair: {e}") from e
    with pair:
        m = _measure(env, pair)
    seq, ryw, conc = m["sequential"], m["wait_for"], m["concurrent"]
    rates = seq["reads_per_s"]
    return Result(
        name="replica",
        unit="reads/s",
        ours=rates["replica"],
        limit=rates["primary"],
        limit_label="the same read from the primary, same run, interleaved",
        target=0.9,
        extra=(
            f"1,000-msg window: replica {rates['replica']:.0f} reads/s vs primary "
            f"{rates['primary']:.0f} (median per-round ratio "
            f"{seq['median_ratio_replica_over_primary']:.2f}); lag check costs "
            f"{(1 - seq['median_ratio_check_over_direct']) * 100:.1f}% vs the replica read "
            f"directly; {THREADS} threads on the replica: {conc['reads_per_s']:.0f} "
            f"reads/s, replica server CPU {conc['server_cpu_ms_per_read']:.1f} ms a read = "
            f"{conc['reads_per_s_per_server_core']:.0f} reads/s per replica core; "
            f"wait_for p50/p99 via replica {ryw['replica']['p50_ms']:.1f}/"
            f"{ryw['replica']['p99_ms']:.1f} ms vs primary {ryw['primary']['p50_ms']:.1f}/"
            f"{ryw['primary']['p99_ms']:.1f} ms (replica reader routing {ryw['routing']})"
        ),
        description=(
            "A private primary and a pg_basebackup streaming replica on this machine. "
            f"ContextReader.context() of a 1,000-message window (whole window returned), "
            f"{ROUNDS} interleaved rounds of {PER_ROUND} sequential reads each: primary, "
            "replica through the routing reader (lag check in the same pipeline), replica "
            f"read directly (no check). Then {THREADS} client threads for "
            f"{THREAD_SECONDS:.0f} s on the replica (the clients share the machine's cores "
            "with both servers; the replica's own CPU per read gives its capacity per "
            "core). Then read-your-writes: XADD through a real `contextlog "
            f"ingest`, then context(wait_for=id), {ROUNDS} interleaved rounds of {PROBES} "
            "probes with the replica reader (waits on the primary, reads on the replica once "
            "it replayed the commit, else falls back) and a primary-only reader."
        ),
        details=m,
    )
