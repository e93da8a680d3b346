"""Producers on fakeredis: ids, sharding, batching, validation before anything is sent."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import fakeredis
import pytest
import redis

from contextlog.producers import (
    AsyncProducer,
    EventRejected,
    EventTooLarge,
    Producer,
    PushUncertain,
    Unavailable,
)
from contextlog.producers import producer as producer_module
from contextlog.producers.commands import parse_duration
from contextlog.producers.ids import derived_id, uuid7
from contextlog.schema import blocks, codec, keys, signing
from contextlog.schema import events as ev
from contextlog.schema.errors import ConfigError

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def producer(server: fakeredis.FakeServer) -> Producer:
    return Producer(fakeredis.FakeRedis(server=server), shards=4, clock=lambda: T0)


def stored(p: Producer, agent: str, channel: str) -> list[ev.AnyEvent]:
    stream = keys.stream(keys.shard_of(agent, channel, 4))
    client: Any = p.redis  # bytes replies
    return [codec.decode_fields(f) for _, f in client.xrange(stream)]


def test_message_lands_on_its_shard_stream(producer: Producer) -> None:
    eid = producer.post_message("alpha", "general", "user", "hello", thread="t1", sender="ada")
    [event] = stored(producer, "alpha", "general")
    assert isinstance(event, ev.MessagePosted)
    assert (str(event.event_id), event.content, event.thread, event.sender) == (
        eid,
        "hello",
        "t1",
        "ada",
    )
    assert event.occurred_at == T0
    others = [
        keys.stream(s)
        for s in range(4)
        if keys.stream(s) != keys.stream(keys.shard_of("alpha", "general", 4))
    ]
    assert all(producer.redis.xlen(s) == 0 for s in others)


def test_event_ids_are_uuid7_and_time_ordered() -> None:
    ids = [uuid7(1_700_000_000_000 + i) for i in range(50)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert ids == sorted(ids)


def test_platform_message_id_gives_the_same_event_id(producer: Producer) -> None:
    a = producer.post_message("alpha", "general", "user", "hi", source="discord", external_id="9")
    b = producer.post_message("alpha", "general", "user", "hi", source="discord", external_id="9")
    c = producer.post_message("alpha", "general", "user", "hi", source="slack", external_id="9")
    assert a == b == str(derived_id("discord", "9"))
    assert c != a


def test_content_blocks_are_accepted_as_dicts(producer: Producer) -> None:
    producer.post_message(
        "alpha",
        "general",
        "assistant",
        [
            {"type": "text", "text": "checking"},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
        ],
    )
    [event] = stored(producer, "alpha", "general")
    assert isinstance(event, ev.MessagePosted) and isinstance(event.content, list)
    block = blocks.check(event.content[1], "$.content[1]")  # kept raw; typed on demand
    assert isinstance(block, ev.ToolUseBlock)
    assert bytes(block.input) == b'{"q":"x"}'


def test_commands_carry_their_fields(producer: Producer) -> None:
    producer.clear("alpha", "general")
    producer.save("alpha", "general", "auth refactor")
    producer.restore("alpha", "general", "last")
    producer.delete_session("alpha", "general", "2026-11-22_x")
    producer.purge_sessions("alpha", "general", 3)
    producer.configure(
        "alpha", "general", idle_timeout=dt.timedelta(minutes=10), rolling_window=3600
    )
    kinds = [ev.kind_of(e) for e in stored(producer, "alpha", "general")]
    assert kinds == [
        "clear.v1",
        "save.v1",
        "restore.v1",
        "delete_session.v1",
        "purge_sessions.v1",
        "configure.v1",
    ]
    configured = stored(producer, "alpha", "general")[-1]
    assert isinstance(configured, ev.Configured)
    assert (configured.idle_timeout, configured.rolling_window, configured.token_budget) == (
        600,
        3600,
        None,
    )


def test_bad_input_raises_and_sends_nothing(producer: Producer) -> None:
    with pytest.raises(EventRejected, match="role"):
        producer.post_message("alpha", "general", "bot", "hi")
    with pytest.raises(EventRejected, match="tool_use input must be a JSON object"):
        producer.post_message(
            "alpha",
            "general",
            "assistant",
            [{"type": "tool_use", "id": "t", "name": "x", "input": 3}],
        )
    with pytest.raises(EventRejected):
        producer.post_message("", "general", "user", "hi")
    with pytest.raises(EventRejected, match="cannot encode"):
        producer.post_message("alpha", "general", "user", "lone surrogate \ud800")
    assert stored(producer, "alpha", "general") == []


@pytest.mark.parametrize("name", ["my\u2028bot", "my\u0085bot", "my\u200bbot", "\u202etobym"])
def test_names_with_invisible_or_separator_characters_are_refused(
    producer: Producer, name: str
) -> None:
    with pytest.raises(EventRejected, match="control, format or separator characters"):
        producer.post_message(name, "general", "user", "hi")
    with pytest.raises(EventRejected, match=r"at `\$\.channel`"):
        producer.clear("alpha", name)
    assert stored(producer, name, "general") == [] and stored(producer, "alpha", name) == []


def test_a_rolling_window_of_0_is_refused(producer: Producer) -> None:
    with pytest.raises(EventRejected, match="rolling_window must be at least 1 second"):
        producer.configure("alpha", "general", rolling_window=0)
    producer.configure("alpha", "general", idle_timeout=0)  # 0 means never, for this one
    (configured,) = stored(producer, "alpha", "general")
    assert isinstance(configured, ev.Configured) and configured.idle_timeout == 0


def test_oversized_event_is_refused_at_the_producer(server: fakeredis.FakeServer) -> None:
    p = Producer(fakeredis.FakeRedis(server=server), shards=4, max_entry_bytes=2048)
    with pytest.raises(EventTooLarge, match="cap is 2048"):
        p.post_message("alpha", "general", "user", "x" * 3000)


def test_batch_sends_everything_in_one_pipeline(producer: Producer) -> None:
    with producer.batch() as b:
        first = b.post_message("alpha", "general", "user", "one")
        b.post_message("alpha", "general", "assistant", "two")
        b.clear("alpha", "general")
        assert stored(producer, "alpha", "general") == []  # nothing before the block ends
    events = stored(producer, "alpha", "general")
    assert [str(e.event_id) for e in events] == b.ids
    assert b.ids[0] == first


@pytest.mark.parametrize("per_channel", [1, 3, 4, 9])
def test_a_batch_lands_every_event_once_in_order_on_each_stream(
    producer: Producer, monkeypatch: pytest.MonkeyPatch, per_channel: int
) -> None:
    """A stream's entries of a send go by one script call each `SCRIPT_CHUNK` (here 4),
    or as plain XADDs below `SCRIPT_MIN`: either way each conversation's events land once,
    in the order posted, interleaved as posted across conversations and shards."""
    monkeypatch.setattr(producer_module, "SCRIPT_CHUNK", 4)
    channels = [f"c{i}" for i in range(6)]  # over several of the 4 shards
    with producer.batch() as b:
        for k in range(per_channel):
            for c in channels:
                b.post_message("alpha", c, "user", f"{c} #{k}")
    for c in channels:
        posted = [e for e in stored(producer, "alpha", c) if e.channel == c]
        assert [e.content for e in posted if isinstance(e, ev.MessagePosted)] == [
            f"{c} #{k}" for k in range(per_channel)
        ]
    client: Any = producer.redis
    entries = [f for s in range(4) for _, f in client.xrange(keys.stream(s))]
    assert sorted(str(codec.decode_fields(f).event_id) for f in entries) == sorted(b.ids)


def test_a_bad_event_in_a_batch_sends_none_of_it(producer: Producer) -> None:
    with pytest.raises(EventRejected), producer.batch() as b:
        b.post_message("alpha", "general", "user", "fine")
        b.post_message("alpha", "general", "nobody", "bad")
    assert stored(producer, "alpha", "general") == []


def test_shard_count_mismatch_with_ingest_is_refused(producer: Producer) -> None:
    producer.redis.set(keys.SHARDS_KEY, 8)
    with pytest.raises(ConfigError, match="CONTEXTLOG_SHARDS=8"):
        producer.post_message("alpha", "general", "user", "hi")


def test_async_producer(server: fakeredis.FakeServer) -> None:
    async def go() -> list[str]:
        p = AsyncProducer(fakeredis.FakeAsyncRedis(server=server), shards=4)
        one = await p.post_message("alpha", "general", "user", "hi")
        async with p.batch() as b:
            b.post_message("alpha", "general", "assistant", "hello")
            b.save("alpha", "general", "greeting")
        await p.aclose()
        return [one, *b.ids]

    ids = asyncio.run(go())
    sync_view = Producer(fakeredis.FakeRedis(server=server), shards=4)
    assert [str(e.event_id) for e in stored(sync_view, "alpha", "general")] == ids


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("10m", 600), ("24h", 86400), ("7d", 604800), ("0", 0)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "ten minutes", "-5m", "1.5h"])
def test_parse_duration_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def _nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return {"deep": value}


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda p: p.post_message("a", "c", "user", None), "content must be a string"),
        (lambda p: p.post_message("a", "c", "user", 123), "content must be a string"),
        (lambda p: p.post_message("a", "c", "user", b"bytes"), "content must be a string"),
        (lambda p: p.configure("a", "c", idle_timeout=float("nan")), "whole seconds"),
        (lambda p: p.configure("a", "c", idle_timeout=float("inf")), "whole seconds"),
        (lambda p: p.configure("a", "c", idle_timeout="10m"), "seconds (a number)"),
        (lambda p: p.configure("a", "c", idle_timeout=1.9), "whole seconds, got 1.9"),
        (lambda p: p.configure("a", "c", rolling_window=True), "seconds (a number)"),
        (lambda p: p.configure("a", "c", token_budget=1.5), "got `float` - at `$.token_budget`"),
        (
            lambda p: p.post_message(
                "a",
                "c",
                "assistant",
                [{"type": "tool_use", "id": "t1", "name": "f", "input": _nested(990)}],
            ),
            "nests",
        ),
        (
            lambda p: p.post_message(
                "a", "c", "user", "x", occurred_at=dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.UTC)
            ),
            "occurred_at must be from 1970-01-01",
        ),
        (
            lambda p: p.post_message(
                "a",
                "c",
                "user",
                "x",
                occurred_at=dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=14))),
            ),
            "occurred_at must be from 1970-01-01",
        ),
    ],
)
def test_any_bad_argument_is_refused_as_event_rejected(
    producer: Producer, call: Any, needle: str
) -> None:
    """Whatever an adapter passes, a bad value is EventRejected naming it, never a
    TypeError or ValueError from deep inside, and nothing is sent."""
    with pytest.raises(EventRejected) as caught:
        call(producer)
    assert needle in caught.value.detail
    assert producer.redis.dbsize() == 0


def test_whole_float_seconds_and_timedeltas_are_taken(producer: Producer) -> None:
    producer.configure("a", "c", idle_timeout=90.0, rolling_window=dt.timedelta(hours=2))
    [event] = stored(producer, "a", "c")
    assert isinstance(event, ev.Configured)
    assert (event.idle_timeout, event.rolling_window) == (90, 7200)


def _results() -> list[ev.Event]:
    common: dict[str, Any] = {"agent": "alpha", "channel": "general", "occurred_at": T0}
    return [
        ev.SummaryGenerated(event_id=uuid7(), session_id="s1", summary="forged", **common),
        ev.ContextCompacted(event_id=uuid7(), through_seq=10**12, summary="forged", **common),
        ev.SessionSaveRequested(event_id=uuid7(), auto=True, **common),
        ev.SessionsExpired(event_id=uuid7(), before=T0, **common),
    ]


@pytest.mark.parametrize("result", _results(), ids=lambda e: ev.kind_of(e))
def test_a_public_producer_refuses_to_build_a_workers_result(
    producer: Producer, result: ev.Event
) -> None:
    """Summaries, compactions and idle-timeout saves change every later context: only a
    worker, holding the signing key, may send them (issue 30.1)."""
    with pytest.raises(EventRejected) as info:
        producer.push(result)
    assert info.value.reason == codec.FORGED
    assert producer.redis.xlen(keys.stream(keys.shard_of("alpha", "general", 4))) == 0
    # A save a person asks for is theirs to send.
    producer.save("alpha", "general", "mine")


def test_only_an_operators_producer_may_erase(server: fakeredis.FakeServer) -> None:
    """An erase removes anyone's words: an adapter without the signing key cannot send one."""
    adapter = Producer(fakeredis.FakeRedis(server=server), shards=4)
    with pytest.raises(EventRejected) as info:
        adapter.erase("alpha", sender="mallory")
    assert info.value.reason == codec.FORGED
    operator = Producer(
        fakeredis.FakeRedis(server=server), shards=4, signing_key=signing.Key.of(b"k" * 32)
    )
    assert len(operator.erase("alpha", sender="mallory")) == 4  # one event a shard


def test_a_workers_producer_signs_its_results_and_nothing_else(
    server: fakeredis.FakeServer,
) -> None:
    key = signing.Key.of(b"k" * 32)
    worker = Producer(fakeredis.FakeRedis(server=server), shards=4, signing_key=key)
    worker.post_message("alpha", "general", "user", "hello")
    for result in _results():
        worker.push(result)
    client: Any = worker.redis
    entries = client.xrange(keys.stream(keys.shard_of("alpha", "general", 4)))
    signatures = [f.get(signing.SIGNATURE_FIELD) for _, f in entries]
    assert signatures[0] is None
    assert all(
        key.verify(f[codec.ENTRY_FIELD], s)
        for (_, f), s in zip(entries[1:], signatures[1:], strict=True)
    )
    assert not key.verify(entries[1][1][codec.ENTRY_FIELD] + b" ", signatures[1])


class LosingAnswers(fakeredis.FakeRedis):
    """A Redis whose next `lose` pipeline answers are lost after it acted on them (a
    timeout or a reset after sending), or that is full (`full`: refuses every XADD)."""

    lose = 0
    full = False

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def execute_then_lose(raise_on_error: bool = True) -> Any:
            if self.full:
                refused = redis.exceptions.OutOfMemoryError(
                    "command not allowed when used memory > 'maxmemory'."
                )
                return [refused for _ in pipe.command_stack]
            replies = execute(raise_on_error=raise_on_error)
            if self.lose:
                self.lose -= 1
                raise redis.TimeoutError("Timeout reading from socket")
            return replies

        pipe.execute = execute_then_lose  # type: ignore[method-assign]
        return pipe


def test_a_push_whose_answer_was_lost_is_sent_again_with_the_same_ids(
    server: fakeredis.FakeServer,
) -> None:
    client = LosingAnswers(server=server)
    producer = Producer(client, shards=4, clock=lambda: T0)
    client.lose = 1
    eid = producer.post_message("alpha", "general", "user", "hi")
    # Sent twice, one event id: ingest stores it once (UNIQUE event id).
    assert [str(e.event_id) for e in stored(producer, "alpha", "general")] == [eid, eid]


def test_a_push_that_may_have_been_stored_says_how_to_retry_without_doubling(
    server: fakeredis.FakeServer,
) -> None:
    client = LosingAnswers(server=server)
    producer = Producer(client, shards=4, clock=lambda: T0)
    client.lose = 2
    with pytest.raises(PushUncertain) as info, producer.batch() as b:
        b.post_message("alpha", "general", "user", "one")
        b.post_message("alpha", "general", "assistant", "two")
    error = info.value
    assert isinstance(error, Unavailable) and "producer.resend(error)" in str(error)
    assert producer.resend(error) == error.event_ids
    ids = [str(e.event_id) for e in stored(producer, "alpha", "general")]
    assert set(ids) == set(error.event_ids) and len(ids) == 6  # three sends, two events


def test_a_full_redis_is_named_and_nothing_was_stored(server: fakeredis.FakeServer) -> None:
    client = LosingAnswers(server=server)
    producer = Producer(client, shards=4, clock=lambda: T0)
    client.full = True
    with pytest.raises(Unavailable, match="Redis is full") as info:
        producer.post_message("alpha", "general", "user", "hi")
    assert not isinstance(info.value, PushUncertain)
    assert "nothing of this push was stored" in str(info.value)


class AsyncLosingAnswers(fakeredis.FakeAsyncRedis):
    """`LosingAnswers`, for the asyncio producer."""

    lose = 0

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        async def execute_then_lose(raise_on_error: bool = True) -> Any:
            replies = await execute(raise_on_error=raise_on_error)
            if self.lose:
                self.lose -= 1
                raise redis.TimeoutError("Timeout reading from socket")
            return replies

        pipe.execute = execute_then_lose  # type: ignore[method-assign]
        return pipe


def test_the_async_producer_retries_and_resends_alike(server: fakeredis.FakeServer) -> None:
    async def go() -> tuple[str, PushUncertain, list[str]]:
        client = AsyncLosingAnswers(server=server)
        p = AsyncProducer(client, shards=4, clock=lambda: T0)
        client.lose = 1
        first = await p.post_message("alpha", "general", "user", "one")
        client.lose = 2
        try:
            await p.post_message("alpha", "general", "assistant", "two")
        except PushUncertain as e:
            return first, e, await p.resend(e)
        raise AssertionError("no PushUncertain")

    first, error, resent = asyncio.run(go())
    [second] = error.event_ids
    assert resent == [second]
    sync = Producer(fakeredis.FakeRedis(server=server), shards=4)
    ids = [str(e.event_id) for e in stored(sync, "alpha", "general")]
    assert ids == [first, first, second, second, second]
