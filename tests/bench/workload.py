"""Synthetic but realistic chat traffic for benchmarks: many interleaved conversations.

Deterministic for a given seed (apart from the UUIDv7 event ids the producer makes), so
two runs push the same mix: plain user/assistant text, and tool rounds (an assistant
`tool_use` answered by a user `tool_result`, then the assistant's reply).
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from contextlog.producers import Batch, Producer

AGENTS = ("support-bot", "research-agent", "coder", "concierge", "triage")
SOURCES = ("discord", "slack", "telegram", "terminal")
TOOLS = ("search_docs", "get_weather", "run_sql", "lookup_order", "fetch_url")
TOOL_SHARE = 0.12  # share of assistant turns that call a tool
THREAD_SHARE = 0.2  # share of conversations that use threads
EXTERNAL_ID_SHARE = 0.5  # share of conversations whose platform gives message ids

_WORDS = [
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "is",
    "it",
    "you",
    "that",
    "for",
    "on",
    "with",
    "as",
    "this",
    "be",
    "are",
    "was",
    "not",
    "have",
    "can",
    "at",
    "context",
    "message",
    "session",
    "agent",
    "channel",
    "thread",
    "summary",
    "window",
    "token",
    "budget",
    "restore",
    "save",
    "clear",
    "please",
    "thanks",
    "could",
    "would",
    "should",
    "help",
    "question",
    "answer",
    "error",
    "config",
    "deploy",
    "server",
    "database",
    "stream",
    "redis",
    "postgres",
    "latency",
    "order",
    "weather",
    "report",
    "draft",
    "review",
    "code",
    "function",
    "test",
    "build",
    "release",
    "ticket",
    "customer",
    "refund",
    "invoice",
    "schedule",
    "meeting",
    "tomorrow",
    "yesterday",
    "today",
    "morning",
    "evening",
    "because",
    "however",
    "maybe",
    "probably",
    "definitely",
    "exactly",
    "quickly",
    "slowly",
    "update",
    "change",
    "check",
    "look",
    "find",
    "show",
    "explain",
    "compare",
    "list",
    "write",
    "read",
]


@dataclass
class _Conversation:
    """One conversation's script state: who talks next and its own clock."""

    agent: str
    channel: str
    source: str
    sender: str
    threads: tuple[str | None, ...]
    external_ids: bool
    clock: dt.datetime
    turn: int = 0
    pending_tool: tuple[str, str] | None = None  # (tool_use id, tool name) awaiting a result
    after_tool: bool = False  # the assistant answers once the tool result is in
    next_role: str = "user"
    thread: str | None = field(default=None)


@dataclass(frozen=True)
class Message:
    """The arguments of one `post_message` call."""

    agent: str
    channel: str
    role: str
    content: str | list[dict[str, Any]]
    thread: str | None
    sender: str | None
    source: str
    external_id: str | None
    occurred_at: dt.datetime


class Traffic:
    """Generates `post_message` calls for `conversations` conversations, interleaved."""

    def __init__(self, conversations: int, seed: int = 20251122) -> None:
        self.rng = random.Random(seed)
        start = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
        self.conversations = [self._conversation(i, start) for i in range(conversations)]

    def _conversation(self, i: int, start: dt.datetime) -> _Conversation:
        rng = self.rng
        agent = AGENTS[i % len(AGENTS)]
        source = SOURCES[i % len(SOURCES)]
        threaded = rng.random() < THREAD_SHARE
        threads = tuple(f"thread-{t}" for t in range(1, 4)) if threaded else (None,)
        return _Conversation(
            agent=agent,
            channel=f"{source}:guild-{i % 37}:channel-{i:05d}",
            source=source,
            sender=f"user-{rng.randrange(10_000, 99_999)}",
            threads=threads,
            external_ids=rng.random() < EXTERNAL_ID_SHARE,
            clock=start + dt.timedelta(seconds=rng.uniform(0, 3600)),
        )

    def messages(self, count: int) -> Iterator[Message]:
        """`count` messages, spread across the conversations in a random interleaving."""
        for _ in range(count):
            yield self._next(self.rng.choice(self.conversations))

    # -- one conversation's next turn -----------------------------------------------------
    def _next(self, c: _Conversation) -> Message:
        c.turn += 1
        c.clock += dt.timedelta(seconds=self.rng.expovariate(1 / 40))
        if c.next_role == "user":
            if c.pending_tool is None:
                c.thread = self.rng.choice(c.threads)
            content = self._user_content(c)
            c.next_role = "assistant"
            role = "user"
        else:
            content = self._assistant_content(c)
            role = "assistant"
        external_id = f"{c.channel}/{c.turn}" if c.external_ids else None
        return Message(
            agent=c.agent,
            channel=c.channel,
            role=role,
            content=content,
            thread=c.thread,
            sender=c.sender if role == "user" else c.agent,
            source=c.source,
            external_id=external_id,
            occurred_at=c.clock,
        )

    def _user_content(self, c: _Conversation) -> str | list[dict[str, Any]]:
        if c.pending_tool is None:
            return self._text(30, 190)
        tool_id, _ = c.pending_tool
        c.pending_tool = None
        c.after_tool = True
        return [{"type": "tool_result", "tool_use_id": tool_id, "content": self._text(80, 220)}]

    def _assistant_content(self, c: _Conversation) -> str | list[dict[str, Any]]:
        if not c.after_tool and self.rng.random() < TOOL_SHARE:
            name = self.rng.choice(TOOLS)
            tool_id = f"toolu_{self.rng.getrandbits(96):024x}"
            c.pending_tool = (tool_id, name)
            c.next_role = "user"  # the tool result comes back as the user turn
            return [
                {"type": "text", "text": self._text(20, 80)},
                {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": name,
                    "input": {"query": self._text(10, 50), "limit": self.rng.randint(1, 20)},
                },
            ]
        c.after_tool = False
        c.next_role = "user"
        return self._text(40, 220)

    def _text(self, low: int, high: int) -> str:
        target = self.rng.randint(low, high)
        words: list[str] = []
        size = 0
        while size < target:
            word = self.rng.choice(_WORDS)
            words.append(word)
            size += len(word) + 1
        return " ".join(words).capitalize() + "."


@dataclass(frozen=True)
class Filled:
    """What `fill` pushed: event ids with their stream payloads, and the time it took."""

    payloads: dict[str, bytes]
    seconds: float

    @property
    def mean_bytes(self) -> float:
        """Mean size of a stream entry's JSON."""
        return sum(map(len, self.payloads.values())) / max(1, len(self.payloads))

    @property
    def tool_events(self) -> int:
        """How many events carry a tool_use or tool_result block."""
        return sum(1 for p in self.payloads.values() if b'"tool_' in p)


def fill(producer: Producer, traffic: Traffic, count: int, batch: int = 1000) -> Filled:
    """Push `count` messages through producer pipelines of `batch` events each."""
    payloads: dict[str, bytes] = {}
    started = time.perf_counter()
    messages = traffic.messages(count)
    remaining = count
    while remaining > 0:
        size = min(batch, remaining)
        with producer.batch() as b:
            for _ in range(size):
                _post(b, next(messages))
        payloads.update((p.event_id, p.payload) for p in b.prepared)
        remaining -= size
    return Filled(payloads, time.perf_counter() - started)


def _post(b: Batch, m: Message) -> None:
    b.post_message(
        m.agent,
        m.channel,
        m.role,
        m.content,
        thread=m.thread,
        sender=m.sender,
        source=m.source,
        external_id=m.external_id,
        occurred_at=m.occurred_at,
    )
