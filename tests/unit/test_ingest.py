"""The ingest loop on fakeredis with the in-memory event log and a fake clock."""

from __future__ import annotations

import gc
import itertools
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import fakeredis
import pytest
from structlog.testing import capture_logs

from contextlog.producers import Producer
from contextlog.schema import codec, keys
from contextlog.schema import events as ev
from contextlog.schema.errors import ShardBusy, Unavailable
from contextlog.worker.app import bootstrap
from contextlog.worker.app.clock import FakeClock
from contextlog.worker.app.config import Settings
from contextlog.worker.ingest import deadletters
from contextlog.worker.ingest.loop import Ingest
from contextlog.worker.ingest.streams import Down, Streams, outages
from contextlog.worker.store.eventlog import Accepted, MemoryEventLog

SHARDS = 4


class Harness:
    """A producer and ingest processes sharing one fake Redis and one memory log."""

    def __init__(self) -> None:
        self.server = fakeredis.FakeServer()
        self.redis: Any = fakeredis.FakeRedis(server=self.server)  # bytes replies
        self.log = MemoryEventLog()
        self.clock = FakeClock()
        self.producer = Producer(self.redis, shards=SHARDS)

    def ingest(
        self,
        name: str = "c1",
        open_log: Callable[[], MemoryEventLog] | None = None,
        **overrides: Any,
    ) -> Ingest:
        settings = Settings(
            shards=SHARDS,
            block_ms=1,
            lease_seconds=6,
            trim_seconds=0,
            max_deliveries=3,
            consumer=name,
            **overrides,
        )
        client = fakeredis.FakeRedis(server=self.server)
        return Ingest(
            settings,
            Streams(client, name),
            open_log or (lambda: self.log),
            self.clock,
            threading.Event(),
            pause=self.clock.sleep,
        )

    def drain(self, ingest: Ingest, steps: int = 5) -> None:
        for _ in range(steps):
            ingest.step()

    def one_pass(self, ingest: Ingest) -> None:
        """Take the leases and recover the shards first, so the pass only reads new
        entries: one `step` of the drain proper."""
        ingest.leases.rebalance()
        for shard, taken in sorted(ingest.leases.recovering.items()):
            ingest.recover(shard, taken)
        ingest.step()

    def stored(self, agent: str = "alpha", channel: str = "general") -> list[tuple[int, str]]:
        return [
            (seq, str(a.event.event_id))
            for seq, a in self.log.rows
            if (a.event.agent, a.event.channel) == (agent, channel)
        ]

    def pending(self) -> int:
        total = 0
        for s in range(SHARDS):
            if self.redis.exists(keys.stream(s)):
                total += self.redis.xpending(keys.stream(s), keys.INGEST_GROUP)["pending"]
        return total

    def dead(self) -> list[dict[bytes, bytes]]:
        return [f for _, f in reversed(deadletters.newest(self.redis, SHARDS, 10_000))]

    def raw_entry(
        self, fields: dict[bytes, bytes], agent: str = "alpha", channel: str = "general"
    ) -> str:
        stream = keys.stream(keys.shard_of(agent, channel, SHARDS))
        return str(self.redis.xadd(stream, fields).decode())


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_valid_entries_are_stored_in_stream_order_and_acknowledged(h: Harness) -> None:
    ids = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(20)]
    ing = h.ingest()
    h.drain(ing)
    assert h.stored() == [(i + 1, eid) for i, eid in enumerate(ids)]
    assert h.pending() == 0


def test_bad_entries_go_to_dead_letters_and_the_good_ones_around_them_are_stored(
    h: Harness,
) -> None:
    before = h.producer.post_message("alpha", "general", "user", "before")
    h.raw_entry({b"e": b"{broken"})
    h.raw_entry({b"e": b'{"type": "poll.v1"}'})
    h.raw_entry({b"other": b"field"})
    h.raw_entry({b"e": b"x" * (codec.DEFAULT_MAX_ENTRY_BYTES + 1)})
    after = h.producer.post_message("alpha", "general", "user", "after")
    h.drain(h.ingest())
    assert [eid for _, eid in h.stored()] == [before, after]
    dead = h.dead()
    assert [d[b"reason"] for d in dead] == [
        b"malformed",
        b"unknown_type",
        b"malformed",
        b"oversized",
    ]
    assert dead[0][b"orig:e"] == b"{broken"  # the original fields are kept
    assert dead[2][b"orig:other"] == b"field"
    assert dead[0][b"stream"] == keys.stream(keys.shard_of("alpha", "general", SHARDS)).encode()
    assert h.redis.hgetall(keys.stats(keys.shard_of("alpha", "general", SHARDS))) == {
        b"dead:malformed": b"2",
        b"dead:unknown_type": b"1",
        b"dead:oversized": b"1",
    }
    assert h.pending() == 0


def test_redelivered_entries_are_stored_once(h: Harness) -> None:
    eid = h.producer.post_message("alpha", "general", "user", "hello")
    # The same event pushed twice (an adapter retry without an external id).
    stream = keys.stream(keys.shard_of("alpha", "general", SHARDS))
    [(_, fields)] = h.redis.xrange(stream)
    h.redis.xadd(stream, fields)
    h.drain(h.ingest())
    assert h.stored() == [(1, eid)]
    assert h.pending() == 0


def test_nothing_is_acknowledged_while_postgres_is_down(h: Harness) -> None:
    ids = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(5)]
    down = True

    def open_log() -> MemoryEventLog:
        if down:
            raise Unavailable("Postgres: connection refused")
        return h.log

    ing = h.ingest(open_log=open_log)
    with capture_logs() as logs:
        h.drain(ing, steps=3)
        assert h.log.rows == []
        assert ing.health.down.keys() == {"postgres"}
        assert h.clock.slept[:3] == [0.05, 0.1, 0.2]  # backoff doubles
        down = False
        h.drain(ing, steps=3)
    events = [e["event"] for e in logs]
    # Logged once per state change, not once per retry.
    assert events.count("dependency unavailable, retrying") == 1
    assert events.count("dependency back") == 1
    assert [eid for _, eid in h.stored()] == ids
    assert ing.health.down == {}
    assert h.pending() == 0


def test_an_outage_is_noted_for_status_until_it_ends(h: Harness) -> None:
    h.producer.post_message("alpha", "general", "user", "m")
    disk_full = "Postgres: could not extend file: No space left on device"
    real_append = h.log.append

    def refuse(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        raise Unavailable(disk_full)

    h.log.append = refuse  # type: ignore[method-assign]
    ing = h.ingest()
    started = int(h.clock.now().timestamp() * 1000)
    h.drain(ing, steps=3)
    h.clock.advance(20)
    h.drain(ing, steps=2)
    live = [ing.streams.consumer]
    assert outages(h.redis, live) == [Down("c1", "postgres", started, disk_full)]
    assert outages(h.redis, []) == []  # only live consumers count
    h.log.append = real_append  # type: ignore[method-assign]
    h.drain(ing, steps=2)
    assert outages(h.redis, live) == [] and len(h.stored()) == 1


def test_a_crash_between_commit_and_ack_stores_nothing_twice(h: Harness) -> None:
    ids = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(5)]
    first = h.ingest("c1")
    original_ack = first.streams.ack
    first.streams.ack = lambda shard, entry_ids: None  # type: ignore[method-assign]
    h.drain(first, steps=2)  # committed, never acknowledged: as if killed right after COMMIT
    assert len(h.log.rows) == 5 and h.pending() == 5
    first.streams.ack = original_ack  # type: ignore[method-assign]
    first.shutdown()
    second = h.ingest("c2")
    h.drain(second)
    assert [eid for _, eid in h.stored()] == ids
    assert h.pending() == 0


def test_entry_caught_killing_ingest_too_often_is_dead_lettered_as_poison(h: Harness) -> None:
    eid = h.producer.post_message("alpha", "general", "user", "poison?")
    stream = keys.stream(keys.shard_of("alpha", "general", SHARDS))
    streams = Streams(h.redis, "crashy")
    streams.ensure_group(keys.shard_of("alpha", "general", SHARDS))
    streams.read_new([keys.shard_of("alpha", "general", SHARDS)], 10, 1)
    for _ in range(3):  # three more deliveries to consumers that then died
        h.redis.xautoclaim(stream, keys.INGEST_GROUP, "crashy", 0, "0-0")
    [(entry_id, _)] = h.redis.xrange(stream)
    streams.mark_inflight(keys.shard_of("alpha", "general", SHARDS), entry_id.decode())
    h.drain(h.ingest())
    assert h.log.rows == []
    [dead] = h.dead()
    assert dead[b"reason"] == b"poison"
    assert b"delivered 5 times" in dead[b"detail"]
    assert eid.encode() in dead[b"orig:e"]
    assert h.pending() == 0


def test_an_entry_the_database_refuses_is_isolated(h: Harness) -> None:
    ids = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(7)]
    h.log.refuse.add(uuid.UUID(ids[3]))
    h.drain(h.ingest())
    assert [eid for _, eid in h.stored()] == ids[:3] + ids[4:]
    [dead] = h.dead()
    assert dead[b"reason"] == b"database_refused"
    assert ids[3].encode() in dead[b"orig:e"]


def test_a_fenced_writer_lets_go_without_acknowledging(h: Harness) -> None:
    h.producer.post_message("alpha", "general", "user", "hello")
    shard = keys.shard_of("alpha", "general", SHARDS)
    ing = h.ingest()
    ing.leases.rebalance()
    h.log.checkpoints[shard] = (ing.leases.owned[shard] + 5, "0-0")  # a newer owner committed
    h.drain(ing, steps=1)
    assert shard not in ing.leases.owned
    assert h.log.rows == [] and h.pending() == 1


def test_two_processes_split_the_shards_and_one_takes_over_when_the_other_leaves(
    h: Harness,
) -> None:
    a, b = h.ingest("a"), h.ingest("b")
    a.leases.rebalance()
    assert len(a.leases.owned) == SHARDS  # alone: everything
    b.leases.rebalance()  # sees two members; a gives back its extras at its next check
    a.leases.rebalance()
    b.leases.rebalance()
    assert len(a.leases.owned) == len(b.leases.owned) == SHARDS // 2
    assert set(a.leases.owned).isdisjoint(b.leases.owned)
    a.shutdown()
    h.clock.advance(7)  # a's membership expires
    b.leases.rebalance()
    assert sorted(b.leases.owned) == list(range(SHARDS))


def test_lease_epochs_never_go_back_below_what_postgres_saw(h: Harness) -> None:
    h.log.checkpoints[0] = (41, "0-0")  # Redis lost its data; Postgres remembers epoch 41
    ing = h.ingest()
    ing.leases.rebalance()
    assert ing.leases.owned[0] == 42


def test_trimming_never_drops_an_unacknowledged_entry(h: Harness) -> None:
    shard = keys.shard_of("alpha", "general", SHARDS)
    stream = keys.stream(shard)
    h.producer.post_message("alpha", "general", "user", "acked-1")
    h.producer.post_message("alpha", "general", "user", "acked-2")
    ing = h.ingest()
    h.drain(ing, steps=2)
    pending = Streams(h.redis, "other")
    h.producer.post_message("alpha", "general", "user", "pending")
    pending.read_new([shard], 10, 1)  # delivered to a consumer, not acknowledged
    h.producer.post_message("alpha", "general", "user", "undelivered")
    Streams(h.redis, "c1").trim(shard)
    left = [codec.decode_fields(f) for _, f in h.redis.xrange(stream)]
    texts = [e.content for e in left if isinstance(e, ev.MessagePosted)]
    assert texts == ["pending", "undelivered"]


def test_stop_ends_the_loop_after_the_batch_in_hand_and_releases_leases(h: Harness) -> None:
    ing = h.ingest()
    eid = h.producer.post_message("alpha", "general", "user", "hi")
    original_process = ing.process

    def process_then_stop(*args: object, **kwargs: object) -> bool:
        ing.stop.set()  # SIGTERM arrives while a batch is in hand
        return original_process(*args, **kwargs)  # type: ignore[arg-type]

    ing.process = process_then_stop  # type: ignore[method-assign]
    assert ing.run() == 0
    assert h.stored() == [(1, eid)] and h.pending() == 0
    assert all(h.redis.get(keys.lease(s)) is None for s in range(SHARDS))
    assert h.redis.zcard(keys.MEMBERS) == 0


def test_accepted_keeps_the_original_bytes(h: Harness) -> None:
    h.producer.post_message("alpha", "general", "user", "hi")
    h.drain(h.ingest())
    [(_, accepted)] = h.log.rows
    assert isinstance(accepted, Accepted)
    assert codec.decode(accepted.payload) == accepted.event


def test_a_long_outage_never_turns_valid_entries_into_poison(h: Harness) -> None:
    ids = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(5)]
    ing = h.ingest()
    real_append = h.log.append

    def down(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        raise Unavailable("Postgres: gone")

    h.log.append = down  # type: ignore[method-assign]
    h.drain(ing, steps=40)  # forty failed passes, each re-reading the batch in hand
    assert ing.retries == 40 and h.dead() == []
    h.log.append = real_append  # type: ignore[method-assign]
    h.drain(ing, steps=2)
    assert [eid for _, eid in h.stored()] == ids
    assert h.dead() == [] and h.pending() == 0


class Crash(BaseException):
    """An entry that kills the ingest process (as a segfault or OOM would)."""


def test_an_entry_that_keeps_killing_ingest_becomes_poison(h: Harness) -> None:
    good = h.producer.post_message("alpha", "general", "user", "good")
    killer = h.producer.post_message("alpha", "general", "user", "killer")
    real_append = h.log.append

    def append(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        if any(str(a.event.event_id) == killer for a in batch):
            raise Crash
        return real_append(shard, epoch, batch)

    h.log.append = append  # type: ignore[method-assign]
    restarts = 0
    while not h.dead():
        ing = h.ingest("ingest-1")  # restarted under the same stable name
        try:
            h.drain(ing, steps=2)
        except Crash:
            restarts += 1
        assert restarts <= 5
    # The crash in the first batch makes both entries suspects; the next owner stores
    # them one at a time, so "good" lands and "killer" is caught in the act. With
    # max_deliveries 3 it is condemned on its fourth delivery, alone.
    assert restarts == 3
    [dead] = h.dead()
    assert dead[b"reason"] == b"poison" and killer.encode() in dead[b"orig:e"]
    h.drain(ing, steps=2)
    assert [eid for _, eid in h.stored()] == [good]


def test_many_deliveries_alone_do_not_condemn_an_entry(h: Harness) -> None:
    # Delivered often (crashes elsewhere, takeovers) but never caught in the act.
    eid = h.producer.post_message("alpha", "general", "user", "innocent")
    shard = keys.shard_of("alpha", "general", SHARDS)
    stream = keys.stream(shard)
    streams = Streams(h.redis, "crashy")
    streams.ensure_group(shard)
    streams.read_new([shard], 10, 1)
    for _ in range(6):
        h.redis.xautoclaim(stream, keys.INGEST_GROUP, "crashy", 0, "0-0")
    h.drain(h.ingest())
    assert h.dead() == [] and [e for _, e in h.stored()] == [eid]
    assert h.redis.get(keys.inflight(shard)) is None  # the marker is cleared after use


def test_undecodable_raw_entries_are_dead_lettered_and_ingest_carries_on(h: Harness) -> None:
    """Invalid UTF-8 (Latin-1 from an adapter in another language) and deep nesting
    raised out of decoding and stopped every ingest process on every start."""
    head = (
        b'{"type":"message.v1","event_id":"0192f5a0-0000-7000-8000-0000000000%02d",'
        b'"agent":"alpha","channel":"general","occurred_at":"%s","role":"user",'
    )
    bad = [
        head % (1, b"2026-01-01T00:00:00Z") + b'"content":"caf\xe9"}',
        head % (2, b"2026-01-01T00:00:00Z")
        + b'"content":"x","x":'
        + b"[" * 2000
        + b"]" * 2000
        + b"}",
        head % (3, b"9999-12-31T23:59:00Z") + b'"content":"x"}',
        head % (4, b"0001-01-01T00:00:00+14:00") + b'"content":"x"}',
    ]
    ids = [h.producer.post_message("alpha", "general", "user", "before")]
    for payload in bad:
        h.raw_entry({codec.ENTRY_FIELD: payload})
    ids.append(h.producer.post_message("alpha", "general", "user", "after"))
    ing = h.ingest()
    h.drain(ing)
    assert ing.crashes == 0
    assert [eid for _, eid in h.stored()] == ids
    assert [d[b"reason"] for d in h.dead()] == [b"malformed", b"invalid", b"invalid", b"invalid"]
    assert [d[b"orig:e"] for d in h.dead()] == bad
    assert h.pending() == 0


def test_an_exception_anywhere_in_the_pipeline_is_survived_and_its_entry_isolated(
    h: Harness,
) -> None:
    """A bug or an entry our code cannot take raises inside a pass: ingest does not die
    (under honcho that stops the whole stack); it retries as a restart would, and the
    poison rule dead-letters the entry that keeps raising. The rest land in order."""
    ids = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(6)]
    culprit = ids[2]
    real_append = h.log.append

    def append(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        if any(str(a.event.event_id) == culprit for a in batch):
            raise OverflowError("date value out of range")
        return real_append(shard, epoch, batch)

    h.log.append = append  # type: ignore[method-assign]
    ing = h.ingest()
    h.drain(ing, steps=12)
    assert 1 <= ing.crashes <= 6
    assert [eid for _, eid in h.stored()] == ids[:2] + ids[3:]
    [dead] = h.dead()
    assert dead[b"reason"] == b"poison" and culprit.encode() in dead[b"orig:e"]
    assert h.pending() == 0
    assert h.redis.get(keys.inflight(keys.shard_of("alpha", "general", SHARDS))) is None


def test_an_entry_that_crashes_decoding_is_isolated_too(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(3)]
    real = codec.decode_fields

    def decode_fields(fields: dict[bytes, bytes], cap: int) -> ev.AnyEvent:
        event = real(fields, cap)
        if str(event.event_id) == ids[1]:
            raise Crash  # as a segfault in a decoder would: the process dies
        return event

    monkeypatch.setattr(codec, "decode_fields", decode_fields)
    restarts = 0
    while not h.dead():
        try:
            h.drain(h.ingest("ingest-1"), steps=2)
        except Crash:
            restarts += 1
        assert restarts <= 6
    h.drain(h.ingest("ingest-1"), steps=2)
    assert [eid for _, eid in h.stored()] == [ids[0], ids[2]]
    assert h.dead()[0][b"reason"] == b"poison"


def test_entries_handed_to_a_stalled_former_owner_are_stored_before_newer_ones(
    h: Harness,
) -> None:
    """A stalled owner's blocking read is served while it sleeps, after its successor
    took over: those entries are older than what the successor reads next, and must be
    stored first (they were stored last, out of order)."""
    shard = keys.shard_of("alpha", "general", SHARDS)
    a = h.ingest("a")
    a.leases.rebalance()
    assert shard in a.leases.owned
    h.redis.delete(keys.lease(shard))  # a's lease ran out while it was stopped
    a.stop.set()  # a sleeps from here on: it never runs another pass
    b = h.ingest("b")
    h.drain(b, steps=2)
    assert shard in b.leases.owned
    older = [h.producer.post_message("alpha", "general", "user", f"old{i}") for i in range(5)]
    a.streams.read_new([shard], 100, 1)  # a's blocking read, served while it sleeps
    newer = [h.producer.post_message("alpha", "general", "user", f"new{i}") for i in range(5)]
    h.drain(b, steps=2)
    assert [eid for _, eid in h.stored()] == older + newer
    assert h.pending() == 0


def _channel_on_another_shard(agent: str, channel: str, among: Sequence[int] = ()) -> str:
    """A channel of `agent` on another shard than `channel` (one of `among`, if given)."""
    shard = keys.shard_of(agent, channel, SHARDS)
    return next(
        c
        for i in range(100)
        if (s := keys.shard_of(agent, c := f"c{i}", SHARDS)) != shard and (not among or s in among)
    )


def test_a_pass_reads_each_shards_next_batch_as_soon_as_its_last_one_is_stored(
    h: Harness,
) -> None:
    """Shards do not wait for each other: one pass keeps storing until the shards are
    empty (not one batch a shard, then a read for all of them), each shard in order."""
    other = _channel_on_another_shard("alpha", "general")
    ids = {
        ch: [h.producer.post_message("alpha", ch, "user", f"m{i}") for i in range(12)]
        for ch in ("general", other)
    }
    ing = h.ingest(batch_size=3, ingest_threads=2)
    h.one_pass(ing)  # one pass: four batches of each shard
    for ch, posted in ids.items():
        assert h.stored("alpha", ch) == [(i + 1, eid) for i, eid in enumerate(posted)]
    assert h.pending() == 0


def test_with_more_shards_than_threads_every_shard_takes_its_turn(h: Harness) -> None:
    """A shard's next batch queues behind the other shards' first ones: two threads do not
    drain two shards to the end while the other two wait for the next pass."""
    channels = [
        next(c for i in range(200) if keys.shard_of("alpha", c := f"c{i}", SHARDS) == s)
        for s in range(SHARDS)
    ]
    for ch in channels:
        for i in range(6):
            h.producer.post_message("alpha", ch, "user", f"m{i}")
    calls: list[int] = []
    real_append = h.log.append

    def append(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        calls.append(shard)
        return real_append(shard, epoch, batch)

    h.log.append = append  # type: ignore[method-assign]
    ing = h.ingest(batch_size=2, batch_bytes=1, ingest_threads=2)  # one read a batch
    h.one_pass(ing)  # one pass: three batches of each shard
    assert sorted(calls) == sorted(list(range(SHARDS)) * 3)
    # Whichever thread runs a shard's second batch has stored a third shard's first one.
    first_again = next(i for i, s in enumerate(calls) if s in calls[:i])
    assert len(set(calls[:first_again])) >= 3
    for ch in channels:
        assert [seq for seq, _ in h.stored("alpha", ch)] == list(range(1, 7))


def test_a_shards_batch_grows_by_reads_until_it_holds_batch_bytes(h: Harness) -> None:
    """A refill reads `batch_size` entries at a time into one batch (one transaction)
    until the batch holds `batch_bytes`; a read that comes back short ends it."""
    for i in range(9):
        h.producer.post_message("alpha", "general", "user", f"m{i}")
    h.producer.post_message("alpha", _channel_on_another_shard("alpha", "general"), "user", "x")
    ours = keys.shard_of("alpha", "general", SHARDS)
    sizes = {sum(map(len, f.values())) for _, f in h.redis.xrange(keys.stream(ours))}
    assert len(sizes) == 1  # every entry the same size
    batches: list[int] = []
    real_append = h.log.append

    def append(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        if shard == ours:
            batches.append(len(batch))
        return real_append(shard, epoch, batch)

    h.log.append = append  # type: ignore[method-assign]
    h.one_pass(h.ingest(batch_size=2, batch_bytes=3 * sizes.pop()))
    # The pass's first read, then 2 + 2 (four entries' bytes reach three's), then 2 + 1.
    assert batches == [2, 4, 3]
    assert [seq for seq, _ in h.stored()] == list(range(1, 10))


def test_an_outage_in_one_shards_task_stops_the_others_after_their_batch_in_hand(
    h: Harness,
) -> None:
    """Postgres goes away under one shard's batch: the pass ends with nothing of that
    batch acknowledged, the other shard stops after the batch it holds instead of
    draining on, and the next passes store everything once, in order."""
    other = _channel_on_another_shard("alpha", "general")
    ids = {
        ch: [h.producer.post_message("alpha", ch, "user", f"m{i}") for i in range(12)]
        for ch in ("general", other)
    }
    failing = keys.shard_of("alpha", "general", SHARDS)
    real_append = h.log.append
    calls: list[int] = []
    failed = threading.Event()
    ing = h.ingest(batch_size=3, ingest_threads=2)

    def append(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        calls.append(shard)
        if shard == failing and calls.count(failing) == 1:
            failed.set()
            raise Unavailable("Postgres: connection lost")
        if shard != failing and calls.count(shard) == 1:
            assert failed.wait(2)  # the other shard's first batch is in hand meanwhile
        return real_append(shard, epoch, batch)

    h.log.append = append  # type: ignore[method-assign]
    h.one_pass(ing)  # the outage: one retry, not a crash
    assert ing.retries == 1 and ing.crashes == 0
    assert h.stored("alpha", "general") == []
    # Its batch in hand, and at most the one its task had read when the failure was seen:
    # not all four of its batches.
    assert len([s for s in calls if s != failing]) <= 2
    h.drain(ing, steps=6)
    for ch, posted in ids.items():
        assert h.stored("alpha", ch) == [(i + 1, eid) for i, eid in enumerate(posted)]
    assert h.pending() == 0


def test_a_refill_leaves_a_shard_a_stalled_owner_was_handed_entries_of_to_recovery(
    h: Harness,
) -> None:
    """As at a pass's start: entries a stalled former owner was handed while we stored
    the shard's batch are older than those our next read gets, so both wait for the
    shard's recovery, which stores them in stream order."""
    target = keys.shard_of("alpha", "general", SHARDS)
    a = h.ingest("a")
    a.leases.rebalance()
    for s in range(SHARDS):  # a's leases and membership ran out while it was stopped
        h.redis.delete(keys.lease(s))
    a.streams.leave()
    a.stop.set()
    b = h.ingest("b", batch_size=2, ingest_threads=2)
    h.drain(b, steps=2)
    assert target in b.leases.owned and len(b.leases.owned) > 1
    other = _channel_on_another_shard("alpha", "general", among=list(b.leases.owned))
    aside = [h.producer.post_message("alpha", other, "user", f"x{i}") for i in range(2)]
    posted = [h.producer.post_message("alpha", "general", "user", f"m{i}") for i in range(6)]
    real_append = h.log.append
    served: list[int] = []

    def append(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        if shard == target and not served:  # a's blocking read, served while it sleeps
            served.extend(len(e) for e in a.streams.read_new([target], 2, 1).values())
        return real_append(shard, epoch, batch)

    h.log.append = append  # type: ignore[method-assign]
    h.drain(b, steps=2)
    assert served == [2]
    assert [eid for _, eid in h.stored()] == posted
    assert [eid for _, eid in h.stored("alpha", other)] == aside
    assert h.pending() == 0


def test_a_busy_shard_waits_in_order_without_counting_deliveries(h: Harness) -> None:
    """A stalled former writer still holds the shard's checkpoint lock: the batch waits
    and is retried, newer entries wait behind it, and no retry counts as a delivery (so
    none becomes poison) or as a crash."""
    older = [h.producer.post_message("alpha", "general", "user", f"old{i}") for i in range(5)]
    ing = h.ingest()
    real_append = h.log.append
    busy = {"left": 8}

    def locked(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        if busy["left"]:
            busy["left"] -= 1
            raise ShardBusy(f"shard {shard}: its checkpoint is locked")
        return real_append(shard, epoch, batch)

    h.log.append = locked  # type: ignore[method-assign]
    h.drain(ing, steps=3)
    newer = [h.producer.post_message("alpha", "general", "user", f"new{i}") for i in range(5)]
    h.drain(ing, steps=12)
    assert busy["left"] == 0
    assert [eid for _, eid in h.stored()] == older + newer
    assert ing.crashes == 0 and h.dead() == [] and h.pending() == 0


def test_a_long_recovery_keeps_its_leases(h: Harness) -> None:
    """Storing redelivered entries takes a while; the owner renews its leases on the way
    instead of losing them half-way (a successor would then store newer entries first)."""
    for i in range(30):
        h.producer.post_message("alpha", "general", "user", f"m{i}")
    shard = keys.shard_of("alpha", "general", SHARDS)
    crashy = Streams(h.redis, "crashy")
    crashy.ensure_group(shard)
    crashy.read_new([shard], 100, 1)
    crashy.mark_inflight(shard, *[e for e, _ in crashy.read_own_pending(shard)][::29])
    ing = h.ingest("b")  # 6 s leases; suspects are stored one at a time
    real_append = h.log.append

    def slow_append(shard: int, epoch: int, batch: Sequence[Accepted]) -> int:
        h.clock.advance(1)  # each store takes a second of the 6 s lease
        return real_append(shard, epoch, batch)

    h.log.append = slow_append  # type: ignore[method-assign]
    renewals: list[float] = []
    real_renew = ing.streams.renew

    def renew(shards: Sequence[int], ttl_ms: int) -> list[int]:
        renewals.append(h.clock.monotonic())
        return real_renew(shards, ttl_ms)

    ing.streams.renew = renew  # type: ignore[method-assign]
    h.drain(ing, steps=2)
    assert len(h.stored()) == 30
    gaps = [b - a for a, b in itertools.pairwise(renewals)]
    assert len(renewals) >= 10 and max(gaps) <= 3


def test_crashes_and_unclean_exits_are_recorded_for_status(h: Harness) -> None:
    from contextlog.worker.ingest.streams import recent_failures

    clean = h.ingest("clean")
    clean.stop.set()
    clean.run()  # a clean stop takes its start note back
    dead = Streams(h.redis, "killed")
    dead.record_start(1_000)  # started, then SIGKILLed: no stop note
    live = Streams(h.redis, "live")
    live.record_start(2_000)
    live.record_crash(3_000, "OverflowError: date value out of range")
    live.record_start(4_000)  # restarted under the same name, and running
    failures = recent_failures(h.redis, ["live"], 0)
    assert [(f.consumer, f.at_ms) for f in failures] == [
        ("killed", 1_000),
        ("live", 2_000),
        ("live", 3_000),
    ]
    assert "OverflowError" in failures[2].error


def test_dead_letters_of_oversized_entries_keep_a_prefix_and_the_stream_is_capped(
    h: Harness,
) -> None:
    from contextlog.worker.ingest.streams import DEAD_LETTER_CAP, ORIG_PREFIX

    huge = b'{"type":"message.v1","content":"' + b"x" * 600_000 + b'"}'
    h.raw_entry({codec.ENTRY_FIELD: huge})
    h.drain(h.ingest())
    [dead] = h.dead()
    assert dead[b"reason"] == b"oversized"
    assert dead[b"orig:e"] == huge[:ORIG_PREFIX] and int(dead[b"orig_bytes:e"]) == len(huge)
    assert 1_000 <= DEAD_LETTER_CAP <= 1_000_000


def test_an_ingest_process_collects_young_garbage_past_a_batch_not_every_700_objects() -> None:
    before = gc.get_threshold()
    try:
        bootstrap.tune_gc_for_batches()
        assert gc.get_threshold() == (bootstrap.INGEST_GC_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0  # what start-up made is left out of collections
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
