"""Benchmark "erase" (issue 34.5): erasing one sender with 10,000 messages among 1M events.

One agent's log of 1M events (`--events N`) over 1,000 conversations; the sender speaks in
100 of them (10,000 messages, each opening an exchange the assistant answers, so about
20,000 events are theirs), saved sessions hold some. The erase is applied as ingest
applies it: one `erase.v1` a shard, each its own batch through `PostgresEventLog`, each
timed; the headline is how many of the agent's events the erase went through a second
(it reads every event of the agent's conversations on its shard once), against a plain
read of the same rows (the floor of any erase that must look at every event).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from typing import Final

import psycopg

from contextlog.schema import codec, erasure
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from tests.bench.harness import BenchEnv, Result
from tests.bench.logfill import T0, Message, sentence, write

DEFAULT_EVENTS: Final = 1_000_000
CONVERSATIONS: Final = 1_000
SPEAKS_IN: Final = 100  # conversations the sender speaks in
SENDER_SHARE: Final = 0.01  # of all events: 10,000 of 1M
SHARDS: Final = 4
AGENT: Final = "bot"


def traffic(seed: int) -> Iterator[Message]:
    """Endless chat in which ann opens SENDER_SHARE of the exchanges, in SPEAKS_IN places."""
    rng = random.Random(seed)
    for _ in itertools.count():
        c = rng.randrange(CONVERSATIONS)
        # Half the events are answers: the sender opens 2 * SENDER_SHARE of the exchanges.
        if c < SPEAKS_IN and rng.random() < 2 * SENDER_SHARE * CONVERSATIONS / SPEAKS_IN:
            yield Message(AGENT, f"c{c}", "user", f"ann: {sentence(rng, 12)}", "ann")
            yield Message(AGENT, f"c{c}", "assistant", sentence(rng, 20))
        else:
            yield Message(AGENT, f"c{c}", "user", sentence(rng, 12), f"user{c}")
            yield Message(AGENT, f"c{c}", "assistant", sentence(rng, 20))


def run(env: BenchEnv) -> Result:
    """The erase's time, shard by shard, beside a plain read of the agent's rows."""
    count = env.events or DEFAULT_EVENTS
    write(env.database_url, traffic(34), count, "log")
    with psycopg.connect(env.database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        (sent,) = conn.execute(
            "SELECT count(*) FROM events WHERE agent = %s AND payload->>'sender' = 'ann'",
            (AGENT,),
        ).fetchone() or (0,)
        started = time.perf_counter()
        conn.execute(  # what an erase must do at least: each row's sender, hashed
            "SELECT count(*) FILTER (WHERE encode(sha256(convert_to(payload->>'sender',"
            " 'UTF8')), 'hex') = %s) FROM events WHERE agent = %s",
            (erasure.subject_hash(AGENT, "sender", "ann"), AGENT),
        ).fetchone()
        scan = time.perf_counter() - started
    per_shard = _erase(env.database_url)
    total = sum(per_shard)
    with psycopg.connect(env.database_url) as conn:
        (erased,) = conn.execute(
            "SELECT count(*) FROM events WHERE payload ? 'erased'"
        ).fetchone() or (0,)
        (left,) = conn.execute(
            "SELECT count(*) FROM events WHERE payload->>'content' LIKE 'ann:%%'"
        ).fetchone() or (0,)
    print(f"  erase: {total:.2f}s over {SHARDS} shards, {erased:,} events redacted", flush=True)
    return Result(
        name="erase",
        unit="events/s",
        ours=count / total,
        limit=count / scan,
        limit_label="one read of the agent's events hashing each row's sender: the floor of "
        "an erase that names its subject by hash and must look at every event",
        target=0.1,
        extra=f"{total:.1f} s in all (longest shard {max(per_shard):.1f} s) for "
        f"{sent:,} messages of the sender, {erased:,} events redacted",
        description=f"Erase one sender ({sent:,} messages, each answered) among "
        f"{count:,} events of one agent's {CONVERSATIONS:,} conversations: the erase "
        "events applied as ingest applies them, one batch a shard.",
        notes=[
            "per shard: " + ", ".join(f"{s:.2f} s" for s in per_shard),
            f"left unerased: {left} messages of the sender (must be 0)",
        ],
        details={
            "events": count,
            "sender_messages": sent,
            "erased": erased,
            "per_shard_s": per_shard,
            "scan_s": scan,
        },
    )


def _erase(url: str) -> list[float]:
    """Apply the erase's events, one batch each; their seconds."""
    log = PostgresEventLog(psycopg.connect(url), now=lambda: T0)
    out = []
    try:
        for e in erasure.request(AGENT, shards=SHARDS, now=T0, sender="ann"):
            payload = codec.encode(e)
            started = time.perf_counter()
            log.append(0, 1, [Accepted("1-0", codec.decode(payload), payload)])
            out.append(time.perf_counter() - started)
    finally:
        log.close()
    return out
