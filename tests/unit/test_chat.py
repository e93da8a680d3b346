"""`contextlog chat` with fakes for the producer and reader: what is stored, what is shown."""

from __future__ import annotations

import io
from typing import Any, cast

import pytest

from contextlog.producers.context import Context
from contextlog.worker.dev.chat import Chat, claude_model, duration, echo_model
from tests.support.fake_anthropic import FakeAPI, Outcome, client_for


class FakeProducer:
    """Records what the chat posts, as the log would store it."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, Any]] = []

    def post_message(self, agent: str, channel: str, role: str, content: Any, **kw: Any) -> str:
        self.posted.append((role, content))
        return f"e{len(self.posted)}"


class FakeReader:
    """The context: every message posted so far, same-role turns merged (as the reader)."""

    def __init__(self, producer: FakeProducer) -> None:
        self.producer = producer

    def context(self, agent: str, channel: str, **kw: Any) -> Context:
        messages: list[dict[str, Any]] = []
        for role, text in self.producer.posted:
            block = {"type": "text", "text": text}
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": role, "content": [block]})
        return Context(messages, token_estimate=7 * len(self.producer.posted))


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


def chat_with(reply: Any, out: io.StringIO | None = None) -> tuple[Chat, FakeProducer, Any]:
    producer = FakeProducer()
    out = out or io.StringIO()
    reader = FakeReader(producer)
    return (
        Chat(cast(Any, producer), cast(Any, reader), cast(Any, None), "a", "c", reply, out),
        producer,
        out,
    )


@pytest.mark.parametrize(
    ("outcome", "says"),
    [
        (Outcome.error(429), "rate limiting this key (HTTP 429)"),
        (Outcome.error(500), "answered HTTP 500: fake 500"),
        (Outcome.error(529), "answered HTTP 529"),
        (Outcome.error(401), "refused ANTHROPIC_API_KEY (HTTP 401)"),
        (Outcome.disconnect(), "cannot reach the Anthropic API"),
        (Outcome.timeout(), "did not answer in time"),
        (Outcome.invalid_json(), "not JSON"),
    ],
)
def test_an_api_failure_is_one_line_and_the_chat_goes_on(outcome: Outcome, says: str) -> None:
    fake = FakeAPI(outcome, Outcome.ok("fine now"))
    chat, producer, out = chat_with(claude_model(client_for(fake), "claude-haiku-4-5"))
    assert chat.handle("hello") is True
    (line,) = out.getvalue().splitlines()
    assert line.startswith("error: no reply: ") and says in line, line
    assert line.endswith("your message is kept, send another to try again")
    assert producer.posted == [("user", "hello")]  # no answer stored for it
    chat.handle("again")
    assert out.getvalue().splitlines()[-1].startswith("a> fine now  [context:")
    assert producer.posted[-1] == ("assistant", "fine now")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("out", "shown"),
    [
        (io.StringIO(), "you> \n* summary (s1): done\nyou> "),
        (Terminal(), "you> \r\x1b[K* summary (s1): done\nyou> "),
    ],
)
def test_a_notice_arriving_at_the_prompt_gets_its_own_line(out: io.StringIO, shown: str) -> None:
    chat, _, _ = chat_with(echo_model, out)
    chat.prompt()
    chat.notify("* summary (s1): done")
    assert out.getvalue() == shown
    chat.answered()  # a line was typed: the next notice prints plainly
    chat.notify("* cleared")
    assert out.getvalue() == shown + "* cleared\n"


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0"), (45, "45s"), (1800, "30m"), (5400, "90m"), (86400, "1d")]
)
def test_durations_are_shown_in_their_largest_whole_unit(seconds: int, text: str) -> None:
    assert duration(seconds) == text
