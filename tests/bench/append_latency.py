"""One bot turn's append: the latency of `PostgresEventLog.append` of a single message.

`python -m tests.bench.append_latency [--appends N] [--pause-ms MS]` (DATABASE_URL set;
not part of `make bench`, which measures rates). `--pause-ms 20` pauses before each
append as the peers benchmark's bot turn does (think time), so every process on the path
starts it cold, as a bot's turn does. It works on a database of its own, created on the
DATABASE_URL server and dropped at the end: 10 conversations of 100 messages, then N
one-event appends spread over them, timed one by one (median and p90). For scale, the
floor: the same one-row INSERT and its COMMIT into a scratch table `LIKE events`, one
transaction with none of the checkpoint, projections or fencing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence

import psycopg

from contextlog.producers.ids import uuid7
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from tests.support.services import create_database, drop_database

CONVERSATIONS, HISTORY, WARMUP = 10, 100, 20
T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def message(channel: str, i: int) -> Accepted:
    event = ev.MessagePosted(
        event_id=uuid7(),
        agent="latency",
        channel=channel,
        occurred_at=T0 + dt.timedelta(seconds=i),
        role="user" if i % 2 == 0 else "assistant",
        content=f"turn {i}: " + "words " * 40,
    )
    return Accepted(f"{i}-0", event, codec.encode(event))


def timed(runs: int, step: Callable[[int], None], pause: float) -> list[float]:
    """Milliseconds of each of `runs` calls of `step`, after WARMUP untimed ones, with
    `pause` seconds between calls (a bot turn follows a person's think time, so
    every process on its path starts it cold)."""
    for i in range(WARMUP):
        step(i)
    taken = []
    for i in range(runs):
        time.sleep(pause)
        start = time.perf_counter()
        step(WARMUP + i)
        taken.append((time.perf_counter() - start) * 1000)
    return taken


def appends(url: str, runs: int, pause: float) -> list[float]:
    log = PostgresEventLog(psycopg.connect(url))
    channels = [f"c{i}" for i in range(CONVERSATIONS)]
    for channel in channels:
        assert log.append(0, 1, [message(channel, i) for i in range(HISTORY)]) == HISTORY

    def step(i: int) -> None:
        assert log.append(0, 1, [message(channels[i % CONVERSATIONS], HISTORY + i)]) == 1

    try:
        return timed(runs, step, pause)
    finally:
        log.close()


def floor(url: str, runs: int, pause: float) -> list[float]:
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE latency_floor (LIKE events INCLUDING ALL)")
        conn.commit()

        def step(i: int) -> None:
            a = message("floor", i)
            with conn.pipeline(), conn.transaction():
                conn.execute(
                    "INSERT INTO latency_floor (event_id, agent, channel, seq, kind,"
                    " occurred_at, payload) VALUES (%s, %s, %s, %s, 'message.v1', %s, %s)",
                    (a.event.event_id, "latency", "floor", i + 1, T0, a.payload.decode()),
                )

        return timed(runs, step, pause)


def summary(label: str, taken: Sequence[float]) -> str:
    p90 = statistics.quantiles(taken, n=10)[-1]
    return f"{label}: median {statistics.median(taken):.3f} ms, p90 {p90:.3f} ms (n={len(taken)})"


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.append_latency", description=__doc__)
    p.add_argument("--appends", type=int, default=300, help="one-event appends timed")
    p.add_argument(
        "--pause-ms", type=float, default=0.0, help="pause before each timed append (ms)"
    )
    args = p.parse_args(argv)
    pause = args.pause_ms / 1000
    base = os.environ.get("DATABASE_URL")
    if not base:
        print("DATABASE_URL is not set", file=sys.stderr)
        return 2
    name = f"contextlog_latency_{uuid.uuid4().hex[:8]}"
    url = create_database(base, name)
    try:
        print(summary("one-event append", appends(url, args.appends, pause)))
        print(summary("floor: INSERT + COMMIT", floor(url, args.appends, pause)))
    finally:
        drop_database(base, name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
