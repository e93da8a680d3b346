"""A thinking, tool-using bot on contextlog, against the fake Messages API that binds every
thinking block to its prefix; and what its requests cost: refused, thinking sent back
where its prefix held, cacheable share, boundaries, over budget.

The tests drive it for many turns and random histories; `make bench` drives it beside
the alternatives a user would pick (tests/bench/thinking.py). Requests go through the
real `anthropic` client to `FakeAPI` (tests.support.fake_anthropic), which answers with
signed thinking, and refuses what the API refuses (tests.support.binding).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anthropic
import psycopg

from contextlog.producers import ContextReader
from contextlog.producers.context import Context
from contextlog.producers.ids import uuid7
from contextlog.schema import codec
from contextlog.schema import events as ev
from contextlog.schema.defaults import ConversationDefaults
from contextlog.worker.store.eventlog import Accepted, PostgresEventLog
from tests.support.binding import THINKING, canon
from tests.support.fake_anthropic import FakeAPI, Outcome, client_for

MODEL: Final = "claude-fable-5-1"
SYSTEM: Final = "You are Ada, a helpful assistant for the team's incident channel. " * 20
TOOLS: Final = [
    {
        "name": "lookup",
        "description": "Look a fact up in the team's runbooks.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    {
        "name": "page",
        "description": "Page the on-call engineer.",
        "input_schema": {"type": "object", "properties": {"who": {"type": "string"}}},
    },
]


class Log:
    """Appends events into the Postgres log as ingest does, at a clock the test sets."""

    def __init__(self, url: str, defaults: ConversationDefaults | None = None) -> None:
        self.now = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
        self.log = PostgresEventLog(
            psycopg.connect(url), defaults=defaults or ConversationDefaults(), now=self._now
        )
        self.n = 0

    def _now(self) -> dt.datetime:
        return self.now

    def add(
        self,
        cls: type[ev.Event],
        at: dt.datetime | None = None,
        channel: str = "general",
        thread: str | None = None,
        agent: str = "alpha",
        **fields: Any,
    ) -> str:
        """Log one event; `at` moves the ingest clock first (the producer's time is
        `occurred_at`, the clock's unless given)."""
        if at is not None:
            self.now = at
        self.n += 1
        event = cls(
            event_id=fields.pop("event_id", None) or uuid7(),
            agent=agent,
            channel=channel,
            thread=thread,
            occurred_at=fields.pop("occurred_at", None) or self.now,
            **fields,
        )
        payload = codec.encode(event)
        self.log.append(0, 1, [Accepted(f"{self.n}-0", codec.decode(payload), payload)])
        return str(event.event_id)

    def say(self, role: str, content: Any, at: dt.datetime | None = None, **kw: Any) -> str:
        return self.add(ev.MessagePosted, at, role=role, content=content, **kw)

    def close(self) -> None:
        self.log.close()


def _tokens(value: Any) -> int:
    return max(1, len(canon(value)) // 4)


def _units(request: dict[str, Any]) -> list[tuple[bytes, int]]:
    """A request as the prompt cache sees it, block by block in cache order (tools,
    system, messages): each block's canonical bytes and its tokens."""
    units = [(canon(t), _tokens(t)) for t in request.get("tools") or []]
    system = request.get("system")
    for b in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
        units.append((canon(b), _tokens(b)))
    for m in request["messages"]:
        content = m["content"]
        for b in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            units.append((m["role"].encode() + canon(b), _tokens(b)))
    return units


def _prefix_hashes(request: dict[str, Any]) -> list[str]:
    """The digest of system, tools and messages[:i], for every i."""
    h = hashlib.sha256(canon([request.get("system"), request.get("tools") or []]))
    out = [h.copy().hexdigest()]
    for m in request["messages"]:
        h.update(canon(m))
        out.append(h.copy().hexdigest())
    return out


@dataclass
class Produced:
    """A thinking block the API produced: its prefix (digest of the request up to the
    message it opened) and where it sits."""

    signature: str
    prefix: str
    index: int  # its assistant message's index in the request that produced it


@dataclass
class Stats:
    """What a bot's requests cost."""

    requests: int = 0
    refused: int = 0
    input_tokens: int = 0
    cacheable_tokens: int = 0
    keepable_thinking: int = 0  # blocks whose prefix held in a later request
    sent_thinking: int = 0  # of those, the ones sent back
    boundaries: int = 0
    over_budget: int = 0
    thinking_removed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def cacheable_share(self) -> float:
        return self.cacheable_tokens / max(1, self.input_tokens)

    @property
    def thinking_share(self) -> float:
        return self.sent_thinking / max(1, self.keepable_thinking)


class Tracker:
    """Measures one thread's requests as they are sent."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.previous: list[tuple[bytes, int]] = []
        self.produced: list[Produced] = []

    def sent(self, request: dict[str, Any]) -> None:
        """Count a request: its cacheable prefix, the thinking it sent back."""
        units = _units(request)
        same = 0
        for (a, tokens), (b, _) in zip(units, self.previous, strict=False):
            if a != b:
                break
            same += tokens
        self.stats.requests += 1
        self.stats.input_tokens += sum(t for _, t in units)
        self.stats.cacheable_tokens += same
        self.previous = units
        prefixes = _prefix_hashes(request)
        messages = request["messages"]
        for p in self.produced:
            if p.index < len(messages) and prefixes[p.index] == p.prefix:
                self.stats.keepable_thinking += 1
                blocks = messages[p.index]["content"]
                self.stats.sent_thinking += any(
                    isinstance(b, dict) and b.get("signature") == p.signature for b in blocks
                )

    def answered(self, request: dict[str, Any], content: list[dict[str, Any]]) -> None:
        """Remember the thinking the answer to `request` holds."""
        prefix = _prefix_hashes(request)[-1]
        for b in content:
            if b.get("type") in THINKING and b.get("signature"):
                self.produced.append(Produced(b["signature"], prefix, len(request["messages"])))


Post = Callable[..., str]


class Bot:
    """A bot with thinking on, its own system prompt and tools, prompt caching, reading
    its context from contextlog before each request and posting each answer verbatim."""

    def __init__(
        self,
        post: Post,
        reader: ContextReader,
        fake: FakeAPI,
        *,
        channel: str = "general",
        budget: int | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.post = post  # post(role, content, thread=...)
        self.reader = reader
        self.fake = fake
        self.client: anthropic.Anthropic = client_for(fake)
        self.channel = channel
        self.budget = budget
        self.stats = stats or Stats()
        self.trackers: dict[str, Tracker] = {}
        self.boundary: dict[str, int] = {}

    def context(self, thread: str | None) -> Context:
        ctx = self.reader.context("alpha", self.channel, thread)
        count = ctx.boundary.count if ctx.boundary else 0
        key = thread or ""
        if key in self.boundary and count != self.boundary[key]:
            self.stats.boundaries += 1
            self.stats.thinking_removed += ctx.thinking_removed
        self.boundary[key] = count
        if self.budget is not None and ctx.token_estimate > self.budget:
            self.stats.over_budget += 1
        return ctx

    def turn(self, text: str, *, thread: str | None = None, tools: int = 0) -> bool:
        """A user message and the bot's answer, calling `tools` tools first; False when
        a request was refused."""
        self.post("user", text, thread=thread)
        tracker = self.trackers.setdefault(thread or "", Tracker(self.stats))
        for step in range(tools + 1):
            ctx = self.context(thread)
            request = ctx.to_anthropic(system=SYSTEM, tools=TOOLS, cache=True)
            if step < tools:
                call = {"type": "tool_use", "id": f"toolu_{uuid7().hex[:20]}", "name": "lookup"}
                self.fake.push(Outcome.reply({**call, "input": {"q": text[:20]}}))
            else:
                self.fake.push(Outcome.reply({"type": "text", "text": f"About {text[:40]}: done."}))
            tracker.sent(request)
            try:
                reply = self.client.messages.create(
                    model=MODEL, max_tokens=1024, thinking={"type": "adaptive"}, **request
                )
            except anthropic.BadRequestError as e:
                self.stats.refused += 1
                self.stats.errors.append(str(e.message)[:300])
                self.fake.script.clear()
                return False
            content = [b.model_dump(exclude_none=True) for b in reply.content]
            tracker.answered(request, content)
            self.post("assistant", content, thread=thread)
            if reply.stop_reason == "tool_use":
                results = [
                    {"type": "tool_result", "tool_use_id": b["id"], "content": "runbook §4"}
                    for b in content
                    if b.get("type") == "tool_use"
                ]
                self.post("user", results, thread=thread)
        return True
