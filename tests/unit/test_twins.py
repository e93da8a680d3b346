"""The sync and asyncio twins cannot drift: every public method of `Producer`,
`ContextReader` and `Notifications` has its twin on `AsyncProducer`, `AsyncContextReader`
and `AsyncNotifications` with the same parameters, and the producers and notification
readers do the same thing on the same input (the readers: tests/integration/test_twins.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import fakeredis
import msgspec
import pytest

from contextlog.producers import (
    AsyncContextReader,
    AsyncNotifications,
    AsyncProducer,
    ContextReader,
    Notifications,
    Producer,
)
from contextlog.producers.ids import uuid7
from contextlog.schema import codec, keys, signing
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.errors import PushUncertain
from tests.support.readers import parameters

T0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
A, C = "alpha", "general"
PAIRS = [
    (Producer, AsyncProducer),
    (ContextReader, AsyncContextReader),
    (Notifications, AsyncNotifications),
]
CLOSE = {"close": "aclose"}  # the one name that differs: asyncio's convention


def public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


@pytest.mark.parametrize(("sync", "twin"), PAIRS, ids=lambda c: c.__name__)
def test_every_public_method_has_its_twin_with_the_same_parameters(sync: type, twin: type) -> None:
    names = {CLOSE.get(n, n) for n in public(sync)}
    assert names == public(twin)
    for name in public(sync):
        assert parameters(getattr(sync, name)) == parameters(
            getattr(twin, CLOSE.get(name, name))
        ), name


# -- the producers: every public method called on both, the same entries result --------

Calls = dict[str, Callable[[Any], Any]]


def producer_calls() -> Calls:
    """One call of each public method (besides construction and closing)."""
    image = {"type": "text", "text": "look"}

    def event(i: int) -> ev.Event:
        return ev.MessagePosted(
            event_id=uuid.UUID(int=i), agent=A, channel=C, occurred_at=T0, role="user", content="x"
        )

    return {
        "post_message": lambda p: p.post_message(A, C, "user", [image], external_id="m1"),
        "clear": lambda p: p.clear(A, C),
        "save": lambda p: p.save(A, C, "a save"),
        "restore": lambda p: p.restore(A, C, "last"),
        "delete_session": lambda p: p.delete_session(A, C, "2026-11-26_x"),
        "purge_sessions": lambda p: p.purge_sessions(A, C, 3),
        "configure": lambda p: p.configure(A, C, idle_timeout=60),
        "set_frame": lambda p: p.set_frame(A, C, model="m", system="s"),
        "search": lambda p: p.search(A, C, "milk OR bread", page=2),
        "set_retention": lambda p: p.set_retention(A, C, keep_log_days=30),
        "erase": lambda p: p.erase(A, sender="mallory"),
        "push": lambda p: p.push(event(1)),
        "push_many": lambda p: p.push_many([event(2), event(3)], atomic=True),
        "send_prepared": lambda p: p.send_prepared([p.encoder.prepare(event(4))]),
        "resend": lambda p: p.resend(uncertain([p.encoder.prepare(event(5))])),
        "batch": lambda p: p.batch(),
        "clock": lambda p: p.clock(),
    }


def uncertain(prepared: list[Any]) -> PushUncertain:
    return PushUncertain("lost", [x.event_id for x in prepared], tuple(prepared))


FRESH = {"event_id", "erase_id"}  # made afresh by each call (UUIDv7, or an erase's own)


def entries(client: Any) -> list[Any]:
    """Every inbound entry, decoded (what ingest would store), fresh event ids left out."""
    found = []
    for shard in range(4):
        for _, fields in client.xrange(keys.stream(shard)):
            entry = msgspec.json.decode(fields[codec.ENTRY_FIELD])
            found.append({k: v for k, v in entry.items() if k not in FRESH})
    return found


def shape(value: Any) -> Any:
    """A call's answer with event ids as a mark (fresh ones differ per call; the entries
    compare the rest)."""
    if isinstance(value, list):
        return [shape(v) for v in value]
    if isinstance(value, str) and len(value) == 36 and uuid.UUID(value):
        return "<id>"
    return value


async def _run(value: Any) -> Any:
    return await value if isinstance(value, Awaitable) else value


async def _batch(producer: AsyncProducer) -> None:
    async with producer.batch() as b:
        b.post_message(A, C, "user", "in a batch", external_id="b1")


def test_both_producers_send_the_same_entries_for_every_call() -> None:
    calls = producer_calls()
    assert set(calls) == public(Producer) - {"from_url", "close"}
    servers = fakeredis.FakeServer(), fakeredis.FakeServer()
    key = signing.Key.of(b"k" * 32)  # an operator's: an erase is signed
    sync = Producer(
        fakeredis.FakeRedis(server=servers[0]), shards=4, clock=lambda: T0, signing_key=key
    )
    twin = AsyncProducer(
        fakeredis.FakeAsyncRedis(server=servers[1]), shards=4, clock=lambda: T0, signing_key=key
    )
    for name, call in calls.items():
        if name == "batch":
            with sync.batch() as b:
                b.post_message(A, C, "user", "in a batch", external_id="b1")
            asyncio.run(_batch(twin))
            continue
        assert shape(call(sync)) == shape(asyncio.run(_run(call(twin)))), name
    assert entries(fakeredis.FakeRedis(server=servers[0])) == entries(
        fakeredis.FakeRedis(server=servers[1])
    )


# -- the notification readers ------------------------------------------------------------


def notice(i: int) -> nt.Notice:
    return nt.Notice(
        notice_id=str(uuid7()),
        kind="restore_done",
        agent=A,
        channel=C,
        occurred_at=T0,
        text=f"restored {i}",
    )


async def _drive(reader: Any) -> list[Any]:
    """Each public method once, on either reader."""
    got = await _run(reader.read(count=2, block_ms=10))
    acked = await _run(reader.ack(got))
    pairs = await _run(reader.read_entries(count=2, block_ms=10))
    through = await _run(reader.ack_through(pairs[-1][0]))
    listened = []
    stream = reader.listen(block_ms=10)
    if isinstance(reader, AsyncNotifications):
        async for n in stream:
            listened.append(n.text)
            break
    else:
        for n in stream:
            listened.append(n.text)
            break
    return [[n.text for n in got], acked, [p[1].text for p in pairs], through, listened]


def test_both_notification_readers_read_and_acknowledge_alike() -> None:
    assert public(Notifications) - {"from_url", "close"} == {
        "read",
        "ack",
        "read_entries",
        "ack_through",
        "listen",
    }
    servers = fakeredis.FakeServer(), fakeredis.FakeServer()
    for server in servers:
        client = fakeredis.FakeRedis(server=server)
        for i in range(5):
            client.xadd(keys.outbox("discord"), {nt.ENTRY_FIELD: msgspec.json.encode(notice(i))})
    readers = (
        Notifications(fakeredis.FakeRedis(server=servers[0]), "discord", consumer="bot"),
        AsyncNotifications(fakeredis.FakeAsyncRedis(server=servers[1]), "discord", consumer="bot"),
    )
    outcomes = [asyncio.run(_drive(reader)) for reader in readers]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == ["restored 0", "restored 1"]
