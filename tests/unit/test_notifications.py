"""Notifications on fakeredis: publish with the worker's notifier, consume as an adapter."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from contextlib import aclosing
from typing import Any

import fakeredis
import msgspec
import pytest

from contextlog.producers.notifications import AsyncNotifications, Notifications, _entries
from contextlog.schema import keys
from contextlog.schema import notices as nt
from contextlog.schema.errors import EventRejected
from contextlog.schema.notices import Notice
from contextlog.worker.effects.notify import MemoryNotifier, RedisNotifier

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def notice(i: int, **fields: Any) -> Notice:
    base: dict[str, Any] = {
        "notice_id": f"n{i}",
        "kind": nt.SESSION_SAVED,
        "agent": "alpha",
        "channel": "general",
        "occurred_at": T0 + dt.timedelta(seconds=i),
    }
    return Notice(**(base | fields))


FULL = notice(
    0,
    kind=nt.SUMMARY_READY,
    thread="t1",
    session_id="2026-11-22_greeting",
    text="We said hello.",
    event_id="0190a4c2-0000-7000-8000-000000000001",
    auto=True,
    local=True,
    failed=True,
)


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def client(server: fakeredis.FakeServer) -> Any:
    return fakeredis.FakeRedis(server=server)


@pytest.fixture
def notifier(client: Any) -> RedisNotifier:
    return RedisNotifier(client)


def consumer(
    server: fakeredis.FakeServer, source: str = "discord", name: str = "c1"
) -> Notifications:
    return Notifications(fakeredis.FakeRedis(server=server), source, consumer=name)


def pending(client: Any, source: str = "discord") -> int:
    return int(client.xpending(keys.outbox(source), "adapter")["pending"])


def publish(n: RedisNotifier, *items: Notice, source: str = "discord") -> None:
    n.publish([(source, item) for item in items])


def test_notices_arrive_in_order_with_every_field(
    server: fakeredis.FakeServer, notifier: RedisNotifier
) -> None:
    sent = [FULL, notice(1), notice(2, kind="some_future_kind")]
    publish(notifier, *sent)
    notes = consumer(server)
    assert notes.read(block_ms=None) == sent
    assert notes.read(block_ms=None) == []


def test_wire_format_omits_defaults_and_round_trips() -> None:
    data = nt.encode(notice(1))
    assert msgspec.json.decode(data) == {
        "notice_id": "n1",
        "kind": "session_saved",
        "agent": "alpha",
        "channel": "general",
        "occurred_at": "2026-11-22T12:00:01Z",
    }
    assert nt.decode(nt.encode(FULL)) == FULL


@pytest.mark.parametrize(
    "bad",
    [
        notice(1, occurred_at=dt.datetime(2026, 11, 22, 12, 0)),  # naive
        notice(1, agent=""),
        notice(1, channel="x" * 201),
    ],
)
def test_encode_refuses_a_notice_readers_would_reject(bad: Notice) -> None:
    with pytest.raises(EventRejected):
        nt.encode(bad)


def test_unacked_notice_is_delivered_again_after_a_restart(
    server: fakeredis.FakeServer, client: Any, notifier: RedisNotifier
) -> None:
    publish(notifier, notice(1), notice(2))
    first = consumer(server)
    one, two = first.read(block_ms=None)
    assert first.ack([one]) == 1
    first.close()

    again = consumer(server)
    assert again.read(block_ms=None) == [two]
    assert again.read(block_ms=None) == []
    assert again.ack([two]) == 1
    assert again.ack([two]) == 0  # already acked: nothing left to send
    assert pending(client) == 0
    assert consumer(server).read(block_ms=None) == []


def test_pending_replay_goes_page_by_page_then_reads_new(
    server: fakeredis.FakeServer, notifier: RedisNotifier
) -> None:
    publish(notifier, *[notice(i) for i in range(5)])
    assert len(consumer(server).read(block_ms=None)) == 5  # delivered, never acked
    publish(notifier, notice(5))
    restarted = consumer(server)
    pages = [restarted.read(count=2, block_ms=None) for _ in range(4)]
    assert [[n.notice_id for n in p] for p in pages] == [
        ["n0", "n1"],
        ["n2", "n3"],
        ["n4"],
        ["n5"],
    ]


def test_each_adapter_sees_only_its_own_stream(
    server: fakeredis.FakeServer, notifier: RedisNotifier
) -> None:
    notifier.publish([("discord", notice(1)), ("slack", notice(2)), ("discord", notice(3))])
    assert [n.notice_id for n in consumer(server, "discord").read(block_ms=None)] == ["n1", "n3"]
    assert [n.notice_id for n in consumer(server, "slack").read(block_ms=None)] == ["n2"]


def test_two_consumers_in_one_group_split_the_entries(
    server: fakeredis.FakeServer, notifier: RedisNotifier
) -> None:
    publish(notifier, *[notice(i) for i in range(4)])
    a, b = consumer(server, name="a"), consumer(server, name="b")
    got_a, got_b = a.read(count=2, block_ms=None), b.read(count=2, block_ms=None)
    assert len(got_a) == len(got_b) == 2
    assert {n.notice_id for n in got_a + got_b} == {"n0", "n1", "n2", "n3"}
    assert a.read(block_ms=None) == b.read(block_ms=None) == []


def test_bad_entries_are_skipped_acked_and_logged(
    server: fakeredis.FakeServer,
    client: Any,
    notifier: RedisNotifier,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = keys.outbox("discord")
    publish(notifier, notice(1))
    client.xadd(stream, {nt.ENTRY_FIELD: b"not json"})
    client.xadd(stream, {"other": b"{}"})
    client.xadd(stream, {nt.ENTRY_FIELD: b'{"notice_id": "n9", "kind": 3}'})
    publish(notifier, notice(2))
    notes = consumer(server)
    with caplog.at_level(logging.WARNING, "contextlog.notifications"):
        got = notes.read(block_ms=None)
    assert [n.notice_id for n in got] == ["n1", "n2"]
    logs = caplog.records
    assert [getattr(r, "reason", None) for r in logs] == ["malformed", "malformed", "invalid"]
    assert all(r.levelname == "WARNING" and getattr(r, "stream", None) == stream for r in logs)
    assert pending(client) == 2  # only the good ones wait for their ack
    notes.ack(got)
    assert pending(client) == 0


def test_a_pending_entry_trimmed_away_is_acked_and_skipped(
    server: fakeredis.FakeServer, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    small = RedisNotifier(client, maxlen=10)
    publish(small, notice(0))
    assert len(consumer(server).read(block_ms=None)) == 1  # delivered, then the adapter dies
    publish(small, *[notice(i) for i in range(1, 50)])
    restarted = consumer(server)
    with caplog.at_level(logging.WARNING, "contextlog.notifications"):
        assert restarted.read(block_ms=None) == []  # the replayed entry has no fields left
    assert [getattr(r, "reason", None) for r in caplog.records] == ["malformed"]
    rest = restarted.read(block_ms=None)  # what is left after trimming, then nothing pending
    assert rest[-1] == notice(49) and len(rest) < 49


def test_the_outbox_stays_bounded(client: Any) -> None:
    small = RedisNotifier(client, maxlen=100)
    for start in range(0, 2000, 200):
        publish(small, *[notice(i) for i in range(start, start + 200)])
    # Approximate trimming may keep up to a node (100 entries by default) over the cap.
    assert client.xlen(keys.outbox("discord")) <= 300


def test_a_notice_published_twice_is_acked_once_for_both(
    server: fakeredis.FakeServer, client: Any, notifier: RedisNotifier
) -> None:
    publish(notifier, notice(1), notice(1))
    notes = consumer(server)
    got = notes.read(block_ms=None)
    assert got == [notice(1), notice(1)]  # at least once: the adapter dedupes by notice_id
    assert notes.ack(got[:1]) == 2
    assert pending(client) == 0


def test_a_destroyed_group_is_recreated(
    server: fakeredis.FakeServer,
    client: Any,
    notifier: RedisNotifier,
    caplog: pytest.LogCaptureFixture,
) -> None:
    notes = consumer(server)
    assert notes.read(block_ms=None) == []
    client.xgroup_destroy(keys.outbox("discord"), "adapter")
    publish(notifier, notice(1))
    with caplog.at_level(logging.WARNING, "contextlog.notifications"):
        assert notes.read(block_ms=None) == [notice(1)]
    assert [r.getMessage() for r in caplog.records] == ["notification group missing, recreating"]


@pytest.mark.parametrize("options", [{"decode_responses": True}, {"protocol": 3}])
def test_other_client_reply_modes(
    server: fakeredis.FakeServer, notifier: RedisNotifier, options: dict[str, Any]
) -> None:
    publish(notifier, FULL, notice(1))
    notes = Notifications(fakeredis.FakeRedis(server=server, **options), "discord")
    got = notes.read(block_ms=None)
    assert got == [FULL, notice(1)]
    assert notes.ack(got) == 2


def test_unified_reply_shape_is_read() -> None:
    reply = {b"s": [(b"1-0", {b"n": b"x"}), (None, None)]}  # legacy_responses=False
    assert _entries(reply) == [("1-0", {b"n": b"x"})]


def test_listen_acks_each_notice_once_the_next_is_asked_for(
    server: fakeredis.FakeServer, client: Any, notifier: RedisNotifier
) -> None:
    publish(notifier, notice(1), notice(2), notice(3))
    notes = consumer(server)
    it = notes.listen(block_ms=10)
    assert next(it) == notice(1)
    assert pending(client) == 3  # n1 is being handled: not acked yet
    assert next(it) == notice(2)
    assert pending(client) == 2
    it.close()  # the adapter stops while handling n2
    # Leaving listen rewinds: n2 (handled or not) and n3 come again, to this object too.
    assert notes.read(block_ms=None) == [notice(2), notice(3)]


def test_iterating_stops_after_close(server: fakeredis.FakeServer, notifier: RedisNotifier) -> None:
    publish(notifier, notice(1), notice(2))
    notes = consumer(server)
    seen = []
    for n in notes:
        seen.append(n.notice_id)
        if n == notice(2):
            notes.close()
    assert seen == ["n1", "n2"]


def test_memory_notifier_records_in_order() -> None:
    fake = MemoryNotifier()
    fake.publish([("discord", notice(1)), ("slack", notice(2))])
    fake.publish([("discord", notice(3))])
    assert fake.of("discord") == [notice(1), notice(3)]
    assert fake.published[1] == ("slack", notice(2))


def test_async_read_ack_and_listen(server: fakeredis.FakeServer, notifier: RedisNotifier) -> None:
    publish(notifier, notice(1), notice(2), notice(3))

    async def go() -> tuple[list[Notice], list[Notice], int]:
        notes = AsyncNotifications(fakeredis.FakeAsyncRedis(server=server), "discord")
        batch = await notes.read(count=1, block_ms=None)
        acked = await notes.ack(batch)
        seen = []
        async with aclosing(notes.listen(block_ms=10)) as it:
            async for n in it:
                seen.append(n)
                if n == notice(3):
                    break
        await notes.aclose()
        return batch, seen, acked

    batch, seen, acked = asyncio.run(go())
    assert (batch, seen, acked) == ([notice(1)], [notice(2), notice(3)], 1)
    sync_view = consumer(server, name="other")
    assert pending(sync_view.redis) == 1  # n3: the loop was left while handling it


def test_async_unacked_is_delivered_again_and_iteration_stops_on_close(
    server: fakeredis.FakeServer, notifier: RedisNotifier
) -> None:
    publish(notifier, notice(1), notice(2))

    async def session(name: str) -> list[str]:
        notes = AsyncNotifications(
            fakeredis.FakeAsyncRedis(server=server), "discord", consumer=name
        )
        seen = []
        async for n in notes:
            seen.append(n.notice_id)
            if n == notice(2):
                await notes.aclose()
        return seen

    async def go() -> tuple[list[str], list[Notice]]:
        seen = await session("c1")
        again = AsyncNotifications(
            fakeredis.FakeAsyncRedis(server=server), "discord", consumer="c1"
        )
        left = await again.read(block_ms=None)
        await again.aclose()
        return seen, left

    seen, left = asyncio.run(go())
    assert seen == ["n1", "n2"]
    assert left == []  # n2 was acked when the loop asked for the next notice
