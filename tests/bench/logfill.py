"""A large log written straight through `PostgresEventLog` (the COPY path ingest takes for
big batches, projections, search and attachment triggers included), without Redis: for
the benchmarks that need millions of stored events quickly (search, erase)."""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg

from contextlog.producers.ids import uuid7
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from tests.bench.workload import _WORDS

BATCH = 5_000
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Message:
    """One message to log: where, who, what."""

    agent: str
    channel: str
    role: str
    text: str
    sender: str | None = None


def sentence(rng: random.Random, words: int) -> str:
    """`words` words of chat, as the ingest benchmark's traffic talks."""
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def write(url: str, messages: Iterator[Message], count: int, label: str) -> float:
    """Log `count` messages in batches; returns the seconds it took (printed as it goes)."""
    started = time.perf_counter()
    at = [T0]
    log = PostgresEventLog(psycopg.connect(url), now=lambda: at[0])
    done = 0
    try:
        while done < count:
            batch = []
            for m in _take(messages, min(BATCH, count - done)):
                e = ev.MessagePosted(
                    event_id=uuid7(),
                    agent=m.agent,
                    channel=m.channel,
                    occurred_at=at[0],
                    role=m.role,  # type: ignore[arg-type]
                    content=m.text,
                    sender=m.sender,
                )
                payload = codec.encode(e)
                batch.append(Accepted(f"{done}-0", e, payload))
            log.append(0, 1, batch)
            done += len(batch)
            at[0] += dt.timedelta(seconds=60)
            if done % (BATCH * 40) == 0 or done == count:
                rate = done / (time.perf_counter() - started)
                print(f"  {label}: {done:,} of {count:,} events ({rate:,.0f}/s)", flush=True)
    finally:
        log.close()
    return time.perf_counter() - started


def _take(items: Iterator[Message], n: int) -> Iterator[Message]:
    for _ in range(n):
        yield next(items)


def timed(fn: Callable[[], object], reps: int, budget_s: float) -> list[float]:
    """Milliseconds of each call of `fn` (after one warm-up), at most `reps` of them or as
    many as fit in `budget_s` seconds (at least 3)."""
    fn()
    out: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(out) < reps and (len(out) < 3 or time.perf_counter() < deadline):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]
