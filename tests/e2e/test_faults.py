"""The fault suite: the deployment under hostile input and broken parts, checked end to end.

Every test runs the real processes (`contextlog ingest`, `contextlog worker`) on a private
Redis and a private Postgres cluster (tests/support/servers.py), which it may crash, while
a `Load` thread pushes valid messages at a steady rate. Whatever breaks, the log must hold
every valid event exactly once, each conversation in push order (seq 1..n), nothing valid
dead-lettered, every hostile entry dead-lettered with a reason, and the processes alive.

Extend it: a new fault is a test that builds a `Stack`, breaks something while a `Load`
runs, and ends with the same checks; a new kind of bad entry is a strategy in
tests/support/fuzz.py; a new API misbehaviour is a `_fault_<name>` method in
tests/support/faulty_api.py. CONTEXTLOG_E2E_SEED replays a run's fuzzing.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from contextlog.producers import Producer
from contextlog.schema import keys
from contextlog.schema.errors import EventRejected
from tests.support import fuzz, properties
from tests.support.fake_anthropic import DEFAULT_TEXT
from tests.support.faulty_api import FaultyAPIServer
from tests.support.fuzz import Raw
from tests.support.processes import ROOT, Process
from tests.support.servers import PostgresCluster, RedisServer
from tests.support.stack import (
    SHARDS,
    Load,
    Stack,
    assert_exactly_once_in_order,
    assert_in_order_without_doubles,
    until,
)

pytestmark = pytest.mark.e2e

SETTLE_S = 30.0  # a hostile entry is dead-lettered (or stored) within this
FUZZ_EXAMPLES = 200  # hypothesis examples, each 1-6 hostile entries amid the load
SUMMARY_SETTLE_S = 60.0  # every summary is written or marked failed within this


FIXED_SEED = 20261122  # the fuzz's draws under a fixed hypothesis profile (`ci`)


def _seed() -> int:
    """CONTEXTLOG_E2E_SEED replays a run; under a fixed hypothesis profile (`ci`, the
    default) every run draws the same entries; otherwise each run picks one (printed)."""
    raw = os.environ.get("CONTEXTLOG_E2E_SEED")
    if raw:
        return int(raw)
    return FIXED_SEED if properties.fixed() else random.SystemRandom().randrange(1 << 32)


# -- hostile entries ---------------------------------------------------------------------


Where = tuple[str, str]  # (stream, entry id): entry ids are unique only within a stream


def push_raw(stack: Stack, entries: list[Raw]) -> list[tuple[Raw, Where]]:
    """XADD each entry below the producer's checks; returns them with where they went."""
    out = []
    for raw in entries:
        stream = keys.stream(raw.shard)
        entry_id: bytes = stack.client.xadd(stream, raw.fields)  # type: ignore[arg-type, assignment]
        out.append((raw, (stream, entry_id.decode())))
    return out


def outcomes(stack: Stack, pushed: list[tuple[Raw, Where]]) -> dict[Where, list[str]]:
    """Where each pushed entry ended up ("dead: <reason>" or "stored")."""
    dead = stack.dead_letters()
    ids = [r.event_id for r, _ in pushed if r.event_id]
    stored = {
        row[0]
        for row in stack.sql(
            "SELECT event_id::text FROM events WHERE event_id = ANY(%s::uuid[])", (ids,)
        )
    }
    found: dict[Where, list[str]] = {}
    for raw, where in pushed:
        places = found.setdefault(where, [])
        letter = dead.get(where)
        if letter is not None:
            places.append(f"dead: {letter.get(b'reason', b'').decode()}")
        if raw.event_id in stored:
            places.append("stored")
    return found


def settle(stack: Stack, pushed: list[tuple[Raw, Where]]) -> dict[Where, list[str]]:
    """Wait until every pushed entry is dead-lettered or stored; check each is in exactly
    one place, with a reason if dead, where the gate's verdict puts it (`fuzz.Raw`), and
    ingest still running."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        stack.assert_running()
        found = outcomes(stack, pushed)
        if all(found.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for raw, where in pushed:
        places = found[where]
        assert places, f"{raw!r} was neither dead-lettered nor stored within {SETTLE_S:.0f}s"
        assert len(places) == 1, f"{raw!r} ended up in {places}"
        assert places[0] != "dead: ", f"{raw!r} was dead-lettered without a reason"
        if raw.must_reject:
            assert places[0].startswith("dead: "), f"{raw!r} was stored"
        else:
            assert places[0] == "stored", f"{raw!r}, which the gate accepts, was {places[0]}"
    return found


def assert_only_hostile_dead(stack: Stack, hostile: set[Where]) -> None:
    """No valid event was dead-lettered: every dead letter comes from a hostile entry."""
    extra = set(stack.dead_letters()) - hostile
    assert not extra, f"{len(extra)} entries dead-lettered that were not hostile: {sorted(extra)}"


@pytest.mark.timeout(180)
def test_fuzzed_entries_are_dead_lettered_while_valid_events_flow(
    make_stack: Callable[..., Stack],
) -> None:
    """Hypothesis XADDs hostile entries (bytes, JSON shapes, broken events) onto the shard
    streams amid 500 valid events/s into two ingests: ingest stays up, each hostile entry
    lands in exactly one place (dead-lettered with a reason when it must be), and every
    valid event is stored once, in order."""
    seed = _seed()
    print(f"seed={seed} (set CONTEXTLOG_E2E_SEED to replay)")
    stack = make_stack()
    stack.add_ingest()
    stack.add_ingest()
    hostile: list[tuple[Raw, Where]] = []

    # One stack for every example: a failure leaves it broken, so nothing to shrink on.
    # The seed decides the draws (derandomize would ignore it), fixed or not by _seed().
    @hypothesis_seed(seed)
    @settings(
        max_examples=FUZZ_EXAMPLES,
        derandomize=False,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(fuzz.raw_entries(), min_size=1, max_size=6))
    def hostile_entries_settle(entries: list[Raw]) -> None:
        pushed = push_raw(stack, entries)
        hostile.extend(pushed)
        settle(stack, pushed)

    with Load(stack.redis.url, rate=500) as load:
        load.wait_pushed(500)
        hostile_entries_settle()
    stack.wait_stored(load)
    assert_exactly_once_in_order(stack.database_url, load)
    found = outcomes(stack, hostile)
    assert_only_hostile_dead(stack, {where for _, where in hostile})
    stack.assert_running()
    dead = sum(p[0].startswith("dead") for p in found.values())
    print(f"{len(hostile)} hostile entries ({dead} dead-lettered, {len(hostile) - dead} "
          f"stored) amid {load.total} valid events")  # fmt: skip


@pytest.mark.timeout(120)
def test_entries_that_crashed_ingest_are_dead_lettered_and_rebuild_still_works(
    make_stack: Callable[..., Stack],
) -> None:
    """The campaign's poison entries (invalid UTF-8, nesting 990/2,000 deep, years 9999
    and 0001+14:00, NUL, oversized) amid valid events: dead-lettered as the gate says,
    ingest stays up and restarts cleanly, `contextlog rebuild` succeeds, and the
    producer refuses the extreme dates itself."""
    stack = make_stack()
    stack.add_ingest()
    stack.add_ingest()
    with Load(stack.redis.url, rate=300) as load:
        load.wait_pushed(300)
        poison = push_raw(stack, fuzz.known_poison())
        found = settle(stack, poison)
        for p in stack.ingests:  # a restart re-reads what is pending: nothing may be left
            p.kill()
            stack.start(p)
        load.wait_pushed(load.total + 600)
    stack.wait_stored(load)
    stack.assert_running()
    assert_exactly_once_in_order(stack.database_url, load)
    assert_only_hostile_dead(stack, {where for _, where in poison})
    print("\n".join(f"{r.label}: {found[e][0]}" for r, e in poison))

    rebuild = subprocess.run(
        [sys.executable, "-m", "contextlog.worker.cli.main", "rebuild"],
        env=stack.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rebuild.returncode == 0, f"rebuild failed:\n{rebuild.stdout}{rebuild.stderr}"

    producer = Producer.from_url(stack.redis.url, shards=SHARDS)
    try:
        for date in fuzz.EXTREME_DATES:
            with pytest.raises(EventRejected):
                producer.post_message(
                    "fuzz", "dates", "user", "hi", occurred_at=dt.datetime.fromisoformat(date)
                )
    finally:
        producer.close()


# -- stalls and crashes ------------------------------------------------------------------


def owners(stack: Stack) -> dict[str, int]:
    """How many shard leases each consumer holds."""
    held: dict[str, int] = {}
    leases: list[bytes | None] = stack.client.mget([keys.lease(s) for s in range(SHARDS)])  # type: ignore[assignment]
    for value in leases:
        if value is not None:
            held[value.decode()] = held.get(value.decode(), 0) + 1
    return held


def grows(stack: Stack, load: Load, by: int = 500, timeout: float = 60.0) -> None:
    """Wait until the log has stored `by` more of the load's events (the stack works)."""
    target = stack.count(load.agent) + by
    until(
        lambda: stack.count(load.agent) >= target,
        timeout,
        lambda: f"{by} more events stored ({stack.count(load.agent)}/{target})\n{stack.tails()}",
    )


STALLS = 6
LEASE_S = 1.0
MIN_STALL_S = 2.5  # each stall outlasts the lease by far, whatever the takeover takes


def in_hand(stack: Stack, consumer: str) -> int:
    """Entries delivered to `consumer` and not acknowledged, over every shard."""
    total = 0
    for shard in range(SHARDS):
        summary: dict[str, Any] = stack.client.xpending(keys.stream(shard), keys.INGEST_GROUP)
        for c in summary.get("consumers") or []:
            if c["name"] in (consumer, consumer.encode()):
                total += int(c["pending"])
    return total


def stall_the_owner(
    stack: Stack, load: Load, by_name: dict[str, Process]
) -> tuple[float, int, int]:
    """SIGSTOP the ingest holding the most shards until the other has taken every lease
    over, and for MIN_STALL_S at least, then SIGCONT it. Returns how long it was frozen,
    how many entries it held unacknowledged, and how many events the log gained meanwhile
    (none, if it froze inside a transaction whose row locks the successor waits for)."""
    until(lambda: owners(stack), 30, lambda: f"a shard owner\n{stack.tails()}")
    held = owners(stack)
    owner = max(held, key=lambda name: held[name])
    (other,) = set(by_name) - {owner}
    before = stack.count(load.agent)
    # Aim at a moment it holds entries it has read and not acknowledged (milliseconds
    # per batch); if none is seen within 2 s, it freezes wherever it is.
    deadline = time.monotonic() + 2.0
    while in_hand(stack, owner) == 0 and time.monotonic() < deadline:
        pass  # no sleep: the window is a few milliseconds wide
    stack.freeze(by_name[owner])
    frozen, holding = time.monotonic(), in_hand(stack, owner)
    try:
        until(
            lambda: owners(stack) == {other: SHARDS},
            30,
            lambda: f"{other} to take every shard from frozen {owner}: {owners(stack)}",
        )
        time.sleep(max(0.0, frozen + MIN_STALL_S - time.monotonic()))  # the fault's length
        gained = stack.count(load.agent) - before
    finally:
        stack.thaw(by_name[owner])
    return time.monotonic() - frozen, holding, gained


@pytest.mark.timeout(120)
def test_per_conversation_order_holds_when_the_owner_stalls(
    make_stack: Callable[..., Stack],
) -> None:
    """Two ingests with 1 s leases under 1,000 events/s; six times, the one holding the
    most shards is SIGSTOPped until the other has taken every shard over (2.5 s at least),
    then SIGCONTed, waking with whatever it had in hand: each event stored once, in push
    order."""
    stack = make_stack()
    for _ in range(2):
        stack.add_ingest(CONTEXTLOG_LEASE_SECONDS=str(LEASE_S))
    by_name = {p.env["CONTEXTLOG_CONSUMER"]: p for p in stack.ingests}
    stalls: list[tuple[float, int, int]] = []
    with Load(stack.redis.url, rate=1000, conversations=40) as load:
        grows(stack, load)
        for _ in range(STALLS):
            stalls.append(stall_the_owner(stack, load, by_name))
            grows(stack, load)
    stack.wait_stored(load)
    stack.assert_running()
    assert_exactly_once_in_order(stack.database_url, load)
    assert_only_hostile_dead(stack, set())
    print(f"{load.total} events, leases {LEASE_S:g}s; (seconds frozen, entries in hand, "
          f"events stored meanwhile): {[(round(s, 1), h, n) for s, h, n in stalls]}")  # fmt: skip


CRASHES = 3
OUTAGE_S = 1.5  # how long each server stays down


@pytest.mark.timeout(150)
def test_postgres_crash_under_load_loses_and_doubles_nothing(
    make_stack: Callable[..., Stack],
) -> None:
    """Postgres killed (`pg_ctl stop -m immediate`) three times under 1,000 events/s into
    two ingests, down 1.5 s each time: ingest waits, recovers, stores each event once, in
    order."""
    stack = make_stack()
    load = crashes_under_load(stack, stack.pg)
    stack.wait_stored(load)
    stack.assert_running()
    assert_exactly_once_in_order(stack.database_url, load)
    assert_only_hostile_dead(stack, set())
    print(f"{load.total} events, {CRASHES} Postgres crashes")


def crashes_under_load(stack: Stack, server: PostgresCluster | RedisServer) -> Load:
    """Two ingests and a worker under 1,000 events/s while `server` is killed CRASHES
    times, down OUTAGE_S each time; the load ends after the last recovery."""
    stack.add_ingest()
    stack.add_ingest()
    stack.add_worker()  # it must ride the outage out too
    with Load(stack.redis.url, rate=1000) as load:
        for _ in range(CRASHES):
            grows(stack, load)
            server.crash()
            time.sleep(OUTAGE_S)  # the outage itself
            server.start()
        grows(stack, load)
    return load


@pytest.mark.timeout(150)
def test_redis_crash_with_aof_under_load_loses_and_doubles_nothing(
    make_stack: Callable[..., Stack],
) -> None:
    """Redis (AOF, fsync always) SIGKILLed three times under 1,000 events/s, down 1.5 s each
    time; producers retry what failed: ingest survives, every event Redis accepted is
    stored once, in order."""
    stack = make_stack(appendonly=True)
    load = crashes_under_load(stack, stack.redis)
    stack.wait_stored(load)
    stack.assert_running()
    assert_exactly_once_in_order(stack.database_url, load)
    assert_only_hostile_dead(stack, set())
    assert load.failed_pushes > 0, "no push met a crash: the outages missed the load"
    print(f"{load.total} events, {CRASHES} Redis crashes, {load.failed_pushes} pushes retried")


@pytest.mark.timeout(150)
def test_redis_restart_without_persistence_keeps_order_and_resumes(
    make_stack: Callable[..., Stack],
) -> None:
    """Redis without persistence SIGKILLed twice under load: what it held is gone (streams,
    groups, leases), but ingest survives, stores nothing twice and nothing out of order,
    and stores every event pushed after each restart."""
    stack = make_stack(appendonly=False)
    stack.add_ingest()
    stack.add_ingest()
    must_have: dict[str, int] = {}
    with Load(stack.redis.url, rate=1000) as load:
        for _ in range(2):
            grows(stack, load)
            stack.redis.crash()
            time.sleep(OUTAGE_S)
            stack.redis.start()
            must_have = load.snapshot()  # what Redis accepts from now on must be stored
        grows(stack, load, by=2000)
    until(
        lambda: all(
            n >= len(load.pushed[c]) - must_have.get(c, 0)
            for c, n in stored_since(stack, load, must_have).items()
        ),
        60,
        lambda: f"the events pushed after the last restart\n{stack.tails()}",
    )
    lost = assert_in_order_without_doubles(stack.database_url, load, must_have)
    stack.assert_running()
    print(f"{load.total} events pushed, {sum(lost.values())} lost with Redis's memory")


def stored_since(stack: Stack, load: Load, since: dict[str, int]) -> dict[str, int]:
    """How many of each conversation's events pushed from position `since[c]` are stored."""
    ids = {c: load.pushed[c][since.get(c, 0) :] for c in load.pushed}
    everything = [e for tail in ids.values() for e in tail]
    rows = stack.sql(
        "SELECT event_id::text FROM events WHERE event_id = ANY(%s::uuid[])", (everything,)
    )
    found = {r[0] for r in rows}
    return {c: sum(e in found for e in tail) for c, tail in ids.items()}


# -- the worker --------------------------------------------------------------------------


def summary_of(stack: Stack, agent: str, channel: str) -> tuple[str | None, bool] | None:
    """(summary, failed) of the conversation's one session; None while it is not saved."""
    rows = stack.sql(
        "SELECT summary, summary_failed FROM sessions WHERE agent = %s AND channel = %s",
        (agent, channel),
    )
    return None if not rows else (rows[0][0], bool(rows[0][1]))


def worker_env(api: FaultyAPIServer, **extra: str) -> dict[str, str]:
    """A worker that summarises with the (faulty) API at `api`."""
    return {
        "ANTHROPIC_API_KEY": "test-key",
        "ANTHROPIC_BASE_URL": api.url,
        "CONTEXTLOG_SWEEP_SECONDS": "1",
        **extra,
    }


def group_gone(group: int) -> bool:
    """Whether no process is left in a process group."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return True
    return False


# The restarted worker takes over its dead namesake's registration and queues again the
# job it had started, so the summary lands after one more 2 s answer. Without that, the
# job stayed "started" under a live name: RQ would fail it only when its execution expired
# and the sweep replace it only after SUMMARY_GRACE_S, minutes later.
SUMMARY_AFTER_KILL_S = 30.0


@pytest.mark.timeout(SUMMARY_AFTER_KILL_S + 90)
def test_worker_sigkill_mid_summary_then_restart_with_the_same_name(
    make_stack: Callable[..., Stack],
) -> None:
    """The worker is SIGKILLed while its summary request is in flight and restarted at
    once with the same CONTEXTLOG_CONSUMER: the restart runs, the killed incarnation's
    scheduler child does not outlive it, and the session's summary lands once."""
    stack = make_stack()
    stack.add_ingest()
    with FaultyAPIServer(slow=2.0) as api:
        worker = stack.add_worker(
            **worker_env(api, CONTEXTLOG_SUMMARY_TIMEOUT="3", CONTEXTLOG_SUMMARY_ATTEMPTS="2")
        )
        producer = Producer.from_url(stack.redis.url, shards=SHARDS)
        try:
            producer.post_message("w", "c", "user", "fault:slow summarise this")
            producer.post_message("w", "c", "assistant", "Sure.")
            producer.save("w", "c", description="killed mid-summary")
        finally:
            producer.close()
        until(lambda: api.busy("slow"), 60, lambda: f"a summary request\n{stack.tails()}")
        killed = worker.groups[-1]
        worker.kill()  # the scheduler child lives on, orphaned, as after a crash
        stack.start(worker)  # same CONTEXTLOG_CONSUMER, at once
        until(
            lambda: (summary_of(stack, "w", "c") or (None, False))[0] is not None,
            SUMMARY_AFTER_KILL_S,
            lambda: f"the killed session's summary\n{stack.tails()}",
        )
        until(lambda: group_gone(killed), 30, lambda: "the orphaned scheduler to exit")
    stack.assert_running()
    assert summary_of(stack, "w", "c") == (DEFAULT_TEXT, False)
    assert api.seen("slow") >= 2, "the killed request was never sent again"
    rows = stack.sql("SELECT count(*) FROM events WHERE agent = 'w' AND kind = 'summary.v1'")
    assert rows == [(1,)], "the summary was stored more than once"


FAULTS = ("ok", "drip", "huge", "nul", "e400", "e500", "e429")


def settled(stack: Stack) -> dict[str, str]:
    """Each fault's summary state, short, for failure messages."""
    out = {}
    for fault in FAULTS:
        state = summary_of(stack, "api", fault)
        out[fault] = (
            "not saved"
            if state is None
            else "pending"
            if state[0] is None
            else ("failed: " if state[1] else "written: ") + f"{len(state[0])} chars"
        )
    return out


@pytest.mark.timeout(180)
def test_summaries_settle_when_the_api_misbehaves(make_stack: Callable[..., Stack]) -> None:
    """One saved session per misbehaviour (drip 1 byte/2 s with a 3 s timeout, 300,000
    chars, U+0000, 400, 500, 429): every summary is written or marked failed within 60 s,
    nothing the database refuses is written, and the worker stays up."""
    stack = make_stack()
    stack.add_ingest()
    with FaultyAPIServer(drip_interval=2.0) as api:
        stack.add_worker(
            **worker_env(api, CONTEXTLOG_SUMMARY_TIMEOUT="3", CONTEXTLOG_SUMMARY_ATTEMPTS="2")
        )
        producer = Producer.from_url(stack.redis.url, shards=SHARDS)
        try:
            for fault in FAULTS:
                producer.post_message("api", fault, "user", f"fault:{fault} summarise this")
                producer.post_message("api", fault, "assistant", "Sure.")
                producer.save("api", fault)
        finally:
            producer.close()
        started = time.monotonic()
        until(
            lambda: all((summary_of(stack, "api", f) or (None, False))[0] for f in FAULTS),
            SUMMARY_SETTLE_S,
            lambda: f"every summary settled: {settled(stack)}\n{stack.tails()}",
        )
        took = time.monotonic() - started
        requests = {f: api.seen(f) for f in FAULTS}
    stack.assert_running()
    got = {f: summary_of(stack, "api", f) for f in FAULTS}
    print(f"settled in {took:.1f}s; requests {requests}; outcomes {settled(stack)}")
    for fault, outcome in got.items():
        assert outcome is not None
        text, failed = outcome
        assert text is not None and len(text) <= 200_000, f"{fault}: {len(text or '')} chars"
        assert "\x00" not in text, f"{fault}: NUL stored"
        if fault == "ok":
            assert not failed
        elif fault in ("drip", "e400", "e500", "e429"):
            assert failed, f"{fault}: summary not marked failed: {text[:80]!r}"
    assert requests["e400"] == 1, "a 400 was retried"
