"""Attachments without servers: what the producer takes out, what the reader puts back,
what the estimate counts, and the async producer's writes (fakeredis)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import uuid
from typing import Any

import fakeredis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextlog.producers import AsyncProducer, EventRejected, EventTooLarge, Producer
from contextlog.producers.attachments import Cache
from contextlog.producers.context import estimate_tokens
from contextlog.schema import attachments, codec, keys
from contextlog.schema import events as ev
from contextlog.worker.ingest.attachments import groups
from contextlog.worker.store.eventlog import Accepted

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
LIMITS = attachments.Limits()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image(data: str, media: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}


def pdf(data: str) -> dict[str, Any]:
    return {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
    }


def restore_all(content: Any, blobs: list[attachments.Blob]) -> Any:
    return attachments.restore(content, {b.sha256: b64(b.data) for b in blobs})


@given(st.binary(min_size=1, max_size=300))
def test_extract_then_restore_gives_the_posted_blocks_back(data: bytes) -> None:
    content = [
        {"type": "text", "text": "look"},
        image(b64(data)),
        {"type": "tool_result", "tool_use_id": "t1", "content": [image(b64(data), "image/gif")]},
        {"type": "document", "source": {"type": "content", "content": [image(b64(data))]}},
        pdf(b64(data)),
    ]
    out, blobs = attachments.extract(content, LIMITS)
    assert blobs == [attachments.Blob(hashlib.sha256(data).hexdigest(), data)]  # once
    assert len(attachments.refs(out)) == 4 and "data" not in str(out)
    assert restore_all(out, blobs) == content


def test_only_canonical_base64_is_taken_out() -> None:
    wrapped = b64(b"x" * 100)[:40] + "\n" + b64(b"x" * 100)[40:]
    spare_bits = "QR=="  # decodes like "QQ==" but re-encodes differently
    unpadded = b64(b"ab").rstrip("=")
    for data in (wrapped, spare_bits, unpadded, "", "not base64!"):
        out, blobs = attachments.extract([image(data)], LIMITS)
        assert (out, blobs) == ([image(data)], [])
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    file = {"type": "document", "source": {"type": "file", "file_id": "file_01"}}
    assert attachments.extract([url, file], LIMITS) == ([url, file], [])


def test_references_cannot_be_posted() -> None:
    ref = attachments.reference(
        {"type": "base64", "media_type": "image/png", "data": ""}, "ab" * 32, 5
    )
    with pytest.raises(EventRejected, match="reserved"):
        attachments.extract([{"type": "image", "source": ref}], LIMITS)


def test_limits_name_the_variable_and_are_checked_before_decoding() -> None:
    small = attachments.Limits(max_bytes=10)
    with pytest.raises(EventTooLarge, match=r"12 bytes, over CONTEXTLOG_MAX_ATTACHMENT_BYTES=10"):
        attachments.extract([image("!" * 16)], small)  # not even base64: the size tells
    with pytest.raises(EventTooLarge, match="12 bytes together"):
        attachments.extract([image(b64(b"a" * 6)), image(b64(b"b" * 6))], small)
    assert attachments.Limits.from_env({}) == attachments.Limits()
    env = {"CONTEXTLOG_MAX_ATTACHMENT_BYTES": "1000", "CONTEXTLOG_ATTACHMENT_TTL": "600"}
    assert attachments.Limits.from_env(env) == attachments.Limits(1000, 600)


def test_the_estimate_is_the_same_before_and_after_extraction() -> None:
    """One home for counting (`schema.blocks.estimate`): a PDF counts by its bytes whether
    inline or stored, so the stored estimate matches what a reader will send."""
    content = [pdf(b64(b"%PDF" + b"x" * 200_000)), image(b64(b"y" * 10))]
    out, _ = attachments.extract(content, LIMITS)
    assert estimate_tokens(out) == estimate_tokens(content) == 10_000 + 1600


def test_producer_writes_bytes_and_entry_in_one_multi() -> None:
    server = fakeredis.FakeServer()
    p = Producer(fakeredis.FakeRedis(server=server), shards=4, clock=lambda: T0)
    data = b"\x89PNG" + bytes(range(256)) * 10
    p.post_message("a", "c", "user", [image(b64(data))])
    p.post_message("b", "d", "user", [image(b64(data))])  # another shard: its own key
    client: Any = p.redis
    for agent, channel in (("a", "c"), ("b", "d")):
        shard = keys.shard_of(agent, channel, 4)
        key = keys.attachment(shard, hashlib.sha256(data).hexdigest())
        assert client.get(key) == data and 0 < client.ttl(key) <= attachments.DEFAULT_TTL_S
        [(_, fields)] = client.xrange(keys.stream(shard))
        event = codec.decode_fields(fields)
        assert isinstance(event, ev.MessagePosted) and b'"data"' not in fields[codec.ENTRY_FIELD]


def test_async_producer_takes_attachments_out_too() -> None:
    server = fakeredis.FakeServer()
    data = bytes(range(200)) * 1000

    async def go() -> str:
        p = AsyncProducer(fakeredis.FakeAsyncRedis(server=server), shards=4, clock=lambda: T0)
        eid: str = await p.post_message("a", "c", "user", [pdf(b64(data))])
        await p.aclose()
        return eid

    asyncio.run(go())
    client: Any = fakeredis.FakeRedis(server=server)
    shard = keys.shard_of("a", "c", 4)
    assert client.get(keys.attachment(shard, hashlib.sha256(data).hexdigest())) == data
    [(_, fields)] = client.xrange(keys.stream(shard))
    assert len(fields[codec.ENTRY_FIELD]) < 600


def test_over_limit_pushes_nothing() -> None:
    server = fakeredis.FakeServer()
    limits = attachments.Limits(max_bytes=100)
    p = Producer(fakeredis.FakeRedis(server=server), shards=4, attachment_limits=limits)
    with pytest.raises(EventTooLarge, match="CONTEXTLOG_MAX_ATTACHMENT_BYTES=100"):
        p.post_message("a", "c", "user", [image(b64(b"z" * 101))])
    assert fakeredis.FakeRedis(server=server).keys("contextlog:*") == []


def test_ingest_batches_are_cut_by_attachment_bytes() -> None:
    def accepted(i: int, size: int) -> Accepted:
        data = bytes([i]) * size
        content, _ = attachments.extract([image(b64(data))], LIMITS)
        event = ev.MessagePosted(
            event_id=uuid.uuid4(),
            agent="a",
            channel="c",
            role="user",
            content=content,
            occurred_at=T0,
        )
        payload = codec.encode(event)
        return Accepted(f"{i}-0", codec.decode(payload), payload)

    batch = [accepted(i, 400) for i in range(5)]
    assert [len(g) for g in groups(batch, limit=1000)] == [2, 2, 1]
    assert [len(g) for g in groups(batch, limit=10_000)] == [5]


def test_reader_cache_keeps_the_most_recent_within_its_limit() -> None:
    cache = Cache(limit=10)
    cache.put({"a": "x" * 6})
    cache.put({"b": "y" * 6})  # "a" dropped
    assert cache.get(["a", "b"]) == {"b": "y" * 6} and cache.size == 6
    cache.put({"c": "z" * 11})  # larger than the whole cache: not kept
    assert cache.get(["c"]) == {}


def test_a_malformed_reference_is_refused_by_the_contract() -> None:
    """An entry written past the producer with a broken reference is dead-lettered, not
    stored: the contract checks sha256, size and media_type."""
    source = {"type": "base64", "media_type": "image/png", "data": ""}
    good = attachments.reference(source, "ab" * 32, 5)
    for bad in ({**good, "sha256": "AB" * 32}, {**good, "size": -1}, {**good, "size": "5"}):
        event = ev.MessagePosted(
            event_id=uuid.uuid4(),
            agent="a",
            channel="c",
            role="user",
            content=[{"type": "image", "source": bad}],  # type: ignore[list-item]
            occurred_at=T0,
        )
        with pytest.raises(EventRejected, match="attachment reference needs"):
            codec.decode(codec.encode(event))
