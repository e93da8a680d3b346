"""An adapter's view of a running stack for the integration tests: ingest running in a
thread, a producer, a reader and the adapter's notifications, RQ jobs run on demand
with the Anthropic API faked at its transport (`stack`, a fixture of tests/integration)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from rq import Queue, SimpleWorker

from contextlog.producers import ContextReader, Producer
from contextlog.producers.notifications import Notifications
from contextlog.schema.notices import Notice
from contextlog.worker.app import bootstrap
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.tasks.compaction import ApiCompactor
from contextlog.worker.tasks.queue import SUMMARIES
from contextlog.worker.tasks.resources import Resources
from contextlog.worker.tasks.summarize import AnthropicSummarizer, Summarizer
from contextlog.worker.tasks.timers import Timers
from tests.support.anthropic_rules import check_messages
from tests.support.fake_anthropic import FakeAPI, client_for
from tests.support.running import eventually, running, settings_for

A, C = "alpha", "general"


@dataclass
class Stack:
    """Ingest running, a producer and reader as an adapter has them, jobs run on demand."""

    settings: Settings
    producer: Producer  # the adapter's
    reader: ContextReader
    notes: Notifications
    rds: redis.Redis
    api: FakeAPI
    worker: Producer  # the worker's: it signs results
    delays: list[float] = field(default_factory=list)
    seen: list[Notice] = field(default_factory=list)

    def use(self, summarizer: Summarizer, compactor: ApiCompactor | None = None) -> None:
        bootstrap.install(
            Resources(
                self.settings,
                self.reader,
                self.worker,
                summarizer,
                SystemClock(),
                Timers(self.rds),
                compactor,
            )
        )

    def say(self, text: str, role: str = "user", channel: str = C, **kw: Any) -> str:
        return self.producer.post_message(A, channel, role, text, source="test", **kw)

    def stored(self, event_id: str) -> None:
        self.reader.context(A, C, wait_for=event_id, timeout=10)

    def run_jobs(self) -> None:
        queue = Queue(SUMMARIES, connection=self.rds)
        SimpleWorker([queue], connection=self.rds).work(burst=True, logging_level="WARNING")

    def notice(self, kind: str, timeout: float = 10) -> Notice:
        def arrived() -> bool:
            got = self.notes.read(block_ms=50)
            self.notes.ack(got)
            self.seen.extend(got)
            return any(n.kind == kind for n in self.seen)

        eventually(arrived, timeout, f"a {kind} notice")
        found = next(n for n in self.seen if n.kind == kind)
        self.seen.remove(found)
        return found

    def valid(self, channel: str = C) -> list[dict[str, Any]]:
        messages = self.reader.context(A, channel).messages
        assert check_messages(messages) == []
        return messages


@pytest.fixture
def stack(
    db: str, redis_url: str, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    settings = settings_for(db, redis_url)
    for name, value in (("DATABASE_URL", db), ("REDIS_URL", redis_url), ("CONTEXTLOG_SHARDS", "4")):
        monkeypatch.setenv(name, value)  # for the CLI commands a test runs
    producer = Producer(redis.Redis.from_url(redis_url), shards=settings.shards)
    worker = Producer(
        redis.Redis.from_url(redis_url),
        shards=settings.shards,
        signing_key=bootstrap.signing_key(settings),
    )
    reader = ContextReader.from_url(db, defaults=settings.conversation)
    notes = Notifications(redis.Redis.from_url(redis_url), "test", consumer="t1")
    api = FakeAPI()
    s = Stack(settings, producer, reader, notes, rds, api, worker)
    s.use(AnthropicSummarizer(client_for(api), "claude-test-1", sleep=s.delays.append))
    with running(settings):
        yield s
    reader.close()
    notes.close()
    producer.close()
    worker.close()
