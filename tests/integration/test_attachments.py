"""Attachments end to end on real Redis and Postgres: a 5 MB image and a 30 MB PDF go
producer -> ingest -> context -> export -> import byte-exact, stored once."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from contextlog.producers import ContextReader, EventTooLarge, Producer
from contextlog.producers.ids import uuid7
from contextlog.schema import attachments, codec, keys
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import queries
from contextlog.worker.app.config import Settings
from contextlog.worker.ingest import deadletters
from contextlog.worker.store import archive
from tests.support.anthropic_rules import check_messages
from tests.support.running import eventually, running, settings_for

A = "bot"
MB = 1_000_000


def blob(size: int, seed: int, head: bytes = b"\x89PNG\r\n\x1a\n") -> bytes:
    return head + random.Random(seed).randbytes(size - len(head))


def image(data: bytes, media: str = "image/png") -> dict[str, Any]:
    b64 = base64.b64encode(data).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": b64}}


def pdf(data: bytes) -> dict[str, Any]:
    b64 = base64.b64encode(data).decode()
    source = {"type": "base64", "media_type": "application/pdf", "data": b64}
    return {"type": "document", "source": source, "title": "report"}


@pytest.fixture
def settings(db: str, redis_url: str) -> Settings:
    return settings_for(db, redis_url)


@pytest.fixture
def producer(settings: Settings, redis_url: str) -> Iterator[Producer]:
    p = Producer.from_url(redis_url, shards=settings.shards)
    yield p
    p.close()


@pytest.fixture
def reader(db: str) -> Iterator[ContextReader]:
    r = ContextReader.from_url(db, defaults=ConversationDefaults())
    yield r
    r.close()


def digest(value: Any) -> str:
    """A short stand-in for a large JSON value (a failure must not print 40 MB)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def stored(db: str) -> list[tuple[str, int]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT sha256, size FROM attachments ORDER BY sha256").fetchall()
    return [(bytes(r[0]).hex(), int(r[1])) for r in rows]


def waiting_keys(rds: redis.Redis) -> list[bytes]:
    return sorted(rds.scan_iter("contextlog:attachment:*"))


def test_image_round_trip_stored_once_across_conversations(
    settings: Settings,
    producer: Producer,
    reader: ContextReader,
    rds: redis.Redis,
    db: str,
    tmp_path: Path,
) -> None:
    """A 5 MB image posted twice in one conversation and once in another is stored once,
    every context gives it back byte-exact, and export -> import carries it."""
    data = blob(5 * MB, 1)
    posted = [{"type": "text", "text": "what is this?"}, image(data)]
    sha = hashlib.sha256(data).hexdigest()
    with running(settings):
        producer.post_message(A, "c1", "user", posted)
        producer.post_message(A, "c1", "assistant", "a cat")
        in_c2 = producer.post_message(A, "c2", "user", posted)
        last = producer.post_message(A, "c1", "user", [image(data)])
        ctx = reader.context(A, "c1", wait_for=last, timeout=30)
        other = reader.context(A, "c2", wait_for=in_c2, timeout=30).messages  # its own shard
        assert digest(other) == digest([{"role": "user", "content": posted}])
        assert stored(db) == [(sha, len(data))]
        eventually(lambda: waiting_keys(rds) == [], what="Redis keys deleted after commit")

        sent = ctx.to_anthropic()["messages"]
        assert digest(sent[0]) == digest({"role": "user", "content": posted})
        assert digest(sent[2]) == digest({"role": "user", "content": [image(data)]})
        got = sent[0]["content"][1]["source"]["data"]
        assert got == posted[1]["source"]["data"]  # the base64 text, byte for byte
        assert base64.b64decode(got) == data
        assert check_messages(ctx.messages) == []

        save = producer.save(A, "c1", "cat pictures")
        reader.context(A, "c1", wait_for=save, timeout=30)
        [info] = reader.sessions(A, "c1").sessions
        path = archive.write(
            archive.document(*archive.load(reader, info.session_id, A, "c1")), tmp_path / "s.json"
        )
        assert digest(json.loads(path.read_text())["messages"][0]["content"]) == digest(posted)

        doc = archive.read(path)
        sent = archive.push(producer, archive.events(doc, A, "c3", ctx.window_start or NOW()))
        reader.context(A, "c3", wait_for=sent, timeout=30)
        restore = producer.restore(A, "c3", info.session_id)
        again = reader.context(A, "c3", wait_for=restore, timeout=30)
        assert digest(again.messages) == digest(ctx.messages)
    assert stored(db) == [(sha, len(data))]  # saves, restores and imports copied nothing


def NOW() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def test_pdf_30mb_round_trip(
    settings: Settings, producer: Producer, reader: ContextReader, rds: redis.Redis, db: str
) -> None:
    """A 30 MB PDF goes through the producer and ingest and comes back byte-exact; the
    stream entry stays small (the bytes wait in their own key, gone after commit)."""
    data = blob(30 * MB, 2, head=b"%PDF-1.7\n")
    posted = [pdf(data), {"type": "text", "text": "summarise this"}]
    producer.configure(A, "docs", token_budget=5_000_000)
    eid = producer.post_message(A, "docs", "user", posted)
    [stream] = [k for k in rds.scan_iter("contextlog:in:*") if rds.xlen(k)]
    entries: Any = rds.xrange(stream)
    entry = entries[-1][1][codec.ENTRY_FIELD]
    assert len(entry) < 1000 and b"contextlog.attachment" in entry
    assert len(waiting_keys(rds)) == 1
    with running(settings):
        ctx = reader.context(A, "docs", wait_for=eid, timeout=60)
        eventually(lambda: waiting_keys(rds) == [], what="Redis key deleted after commit")
    assert digest(ctx.messages) == digest([{"role": "user", "content": posted}])
    assert base64.b64decode(ctx.messages[0]["content"][0]["source"]["data"]) == data
    assert stored(db) == [(hashlib.sha256(data).hexdigest(), len(data))]
    assert ctx.token_estimate >= len(data) // 20 // 1  # counted by its size, as inline


def test_over_limit_is_refused_at_the_producer_naming_the_limit(
    producer: Producer, rds: redis.Redis
) -> None:
    """An attachment over CONTEXTLOG_MAX_ATTACHMENT_BYTES: EventTooLarge, nothing pushed."""
    small = Producer(rds, shards=4, attachment_limits=attachments.Limits(max_bytes=1 * MB))
    with pytest.raises(EventTooLarge, match="CONTEXTLOG_MAX_ATTACHMENT_BYTES=1000000"):
        small.post_message(A, "c", "user", [image(blob(MB + 1, 3))])
    with pytest.raises(EventTooLarge, match="together, over CONTEXTLOG_MAX_ATTACHMENT_BYTES"):
        small.post_message(A, "c", "user", [image(blob(MB // 2, 4)), image(blob(MB // 2 + 1, 5))])
    big = blob(33 * 1024 * 1024, 6)  # over the default, the API's 32 MB request limit
    with pytest.raises(EventTooLarge, match="33554432"):
        producer.post_message(A, "c", "user", [pdf(big)])
    assert [k for k in rds.scan_iter("contextlog:*") if not k.startswith(b"contextlog:test")] == []


def test_missing_bytes_dead_letter_only_their_entry(
    settings: Settings, producer: Producer, reader: ContextReader, rds: redis.Redis
) -> None:
    """Bytes expired from Redis before ingest: that entry is dead-lettered with the reason,
    the rest of its batch is stored."""
    producer.post_message(A, "c", "user", [image(blob(1000, 7)), {"type": "text", "text": "x"}])
    for key in waiting_keys(rds):
        rds.delete(key)
    last = producer.post_message(A, "c", "user", "still here")
    with running(settings):
        ctx = reader.context(A, "c", wait_for=last, timeout=30)
    assert ctx.messages == [{"role": "user", "content": [{"type": "text", "text": "still here"}]}]
    dead: Any = deadletters.newest(rds, settings.shards, 10)
    [(_, fields)] = dead
    assert fields[b"reason"] == attachments.MISSING.encode()


def test_old_inline_entry_still_reads_back(
    settings: Settings, reader: ContextReader, rds: redis.Redis
) -> None:
    """A message.v1 entry written before attachments, base64 inline, is stored and read
    back as it was."""
    posted = [image(blob(3000, 8)), {"type": "text", "text": "old"}]
    event = ev.MessagePosted(
        event_id=uuid7(),
        agent=A,
        channel="old",
        role="user",
        content=posted,  # type: ignore[arg-type]
        occurred_at=NOW(),
    )
    shard = keys.shard_of(A, "old", settings.shards)
    rds.xadd(keys.stream(shard), {codec.ENTRY_FIELD: codec.encode(event)})
    with running(settings):
        ctx = reader.context(A, "old", wait_for=str(event.event_id), timeout=30)
    assert digest(ctx.messages) == digest([{"role": "user", "content": posted}])


def test_reads_without_bytes_do_not_load_them(
    settings: Settings, producer: Producer, reader: ContextReader
) -> None:
    """History, session listings, counts and the summary's input never read the bytes:
    no query but the attachment ones names the table (and of those, only the one that puts
    the bytes back into a context reads them), and session messages (what the summarizer
    reads) hold the reference (`reader_role` only grants the table to readers)."""
    users = {n for n, q in queries().items() if "attachments" in q}
    assert users == {
        "attachments_stored",
        "insert_attachment",
        "attachment_data",
        "lock_attachments",  # an erase or retention, before deleting what nothing references
        "drop_unreferenced_attachments",
        "reader_role",
    }
    producer.post_message(A, "h", "user", [image(blob(2000, 9))])
    save = producer.save(A, "h")
    with running(settings):
        reader.context(A, "h", wait_for=save, timeout=30)
    [info] = reader.sessions(A, "h").sessions
    assert info.message_count == 1
    _, [message] = reader.session_messages(info.session_id, agent=A, channel="h")
    assert isinstance(message.content, list)
    assert message.content[0]["source"]["type"] == attachments.SOURCE_TYPE
    assert "data" not in message.content[0]["source"]
