"""`contextlog chat` with fakes for the producer and reader: what is stored, what is shown."""

from __future__ import annotations

import io
from typing import Any, cast

from contextlog.producers.context import Context
from contextlog.worker.dev.chat import Chat, echo_model


class FakeProducer:
    """Records what the chat posts, as the log would store it."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, Any]] = []

    def post_message(self, agent: str, channel: str, role: str, content: Any, **kw: Any) -> str:
        self.posted.append((role, content))
        return f"e{len(self.posted)}"


class FakeReader:
    """The context: every message posted so far."""

    def __init__(self, producer: FakeProducer) -> None:
        self.producer = producer

    def context(self, agent: str, channel: str, **kw: Any) -> Context:
        messages = [
            {"role": r, "content": [{"type": "text", "text": c}]} for r, c in self.producer.posted
        ]
        return Context(messages, token_estimate=7 * len(messages))


def test_the_context_tag_is_shown_but_never_stored() -> None:
    producer = FakeProducer()
    out = io.StringIO()
    chat = Chat(
        cast(Any, producer),
        cast(Any, FakeReader(producer)),
        cast(Any, None),
        "a",
        "c",
        echo_model,
        out,
    )
    chat.handle("hello there")
    chat.handle("again")
    assert producer.posted == [
        ("user", "hello there"),
        ("assistant", "(echo) hello there"),
        ("user", "again"),
        ("assistant", "(echo) again"),
    ]
    shown = out.getvalue().splitlines()
    assert shown == [
        "a> (echo) hello there  [context: 1 turns, ~7 tokens]",
        "a> (echo) again  [context: 3 turns, ~21 tokens]",
    ]


def test_the_tag_says_when_the_older_part_was_summarised() -> None:
    from contextlog.worker.dev.chat import context_tag

    assert context_tag(Context([], token_estimate=5)) == "[context: 0 turns, ~5 tokens]"
    assert context_tag(Context([], token_estimate=5, compacted=True)) == (
        "[context: 0 turns, ~5 tokens, older part summarised]"
    )
