"""The request an adapter sends: its own system prompt and tools composed with the
context, in cache order, and prompt-cache breakpoints that the API accepts."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextlog.producers.context import Segment, StoredMessage, build_context
from tests.support import properties
from tests.support.anthropic_rules import check_messages, check_params
from tests.support.blocks import conversation, thinking, use
from tests.support.fake_anthropic import FakeAPI, client_for

TOOLS = [
    {"name": "lookup", "description": "Look something up.", "input_schema": {"type": "object"}},
    {"name": "weather", "description": "Weather.", "input_schema": {"type": "object"}},
]
BOT = "You are a helpful bot."


def stored(convo: list[tuple[str, Any]]) -> list[StoredMessage]:
    return [StoredMessage(i + 1, role, content, 20) for i, (role, content) in enumerate(convo)]


def marks(kw: dict[str, Any]) -> int:
    text = json.dumps(kw)
    return text.count('"cache_control"')


def test_the_bots_system_and_tools_compose_with_the_header_in_cache_order() -> None:
    ctx = build_context(stored([("user", "hi")]), Segment(note="Resumed session s1."))
    kw = ctx.to_anthropic(system=BOT, tools=TOOLS)
    assert list(kw) == ["tools", "system", "messages"]
    # The bot's prompt first (stable for its lifetime), our header after it.
    assert kw["system"] == [
        {"type": "text", "text": BOT},
        {"type": "text", "text": "Resumed session s1."},
    ]
    assert kw["tools"] == TOOLS
    fake = FakeAPI()
    client_for(fake).messages.create(model="m", max_tokens=10, **kw)  # no duplicate keyword
    assert fake.requests[-1]["system"][0]["text"] == BOT


def test_without_a_header_the_bots_system_is_passed_as_given() -> None:
    ctx = build_context(stored([("user", "hi")]))
    assert ctx.to_anthropic(system=BOT)["system"] == BOT
    blocks = [{"type": "text", "text": BOT}]
    assert ctx.to_anthropic(system=blocks)["system"] == blocks
    assert "system" not in ctx.to_anthropic() and "tools" not in ctx.to_anthropic()


def test_cache_marks_the_bots_prompt_the_newest_turn_and_the_previous_one() -> None:
    convo = [("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2"),
             ("user", "q3")]  # fmt: skip
    ctx = build_context(stored(convo), Segment(note="Summary: earlier talk."))
    kw = ctx.to_anthropic(system=BOT, tools=TOOLS, cache=True)
    eph = {"type": "ephemeral"}
    assert kw["system"][0]["cache_control"] == eph  # the bot's stable part
    assert kw["system"][1]["cache_control"] == eph  # our header
    assert kw["messages"][-1]["content"][-1]["cache_control"] == eph  # the newest turn
    assert kw["messages"][-3]["content"][-1]["cache_control"] == eph  # the previous end
    assert marks(kw) == 4
    assert "cache_control" not in json.dumps(ctx.messages)  # the context is not changed


def test_breakpoints_the_adapter_set_count_against_the_four() -> None:
    ctx = build_context(stored([("user", "q1"), ("assistant", "a1"), ("user", "q2")]))
    tools = [{**t, "cache_control": {"type": "ephemeral"}} for t in TOOLS]  # 2 of its own
    own = [{"type": "text", "text": BOT, "cache_control": {"type": "ephemeral"}}]
    kw = ctx.to_anthropic(system=own, tools=tools, cache=True)
    assert marks(kw) == 4 and check_params(kw) == []
    assert "cache_control" in kw["messages"][-1]["content"][-1]  # the newest turn first


def test_a_breakpoint_is_never_put_on_thinking() -> None:
    convo = [("user", "q"), ("assistant", [thinking("1"), use("a")]),
             ("user", [{"type": "tool_result", "tool_use_id": "a", "content": "ok"}]),
             ("assistant", [thinking("2"), {"type": "text", "text": "so"}])]  # fmt: skip
    kw = build_context(stored(convo)).to_anthropic(cache=True)
    assert check_messages(kw["messages"], thinking=True) == []  # the oracle refuses it
    last = kw["messages"][-1]["content"]
    assert "cache_control" not in last[0] and "cache_control" in last[-1]


@settings(max_examples=properties.examples(200), deadline=None)
@given(
    convo=conversation(True),
    budget=st.integers(30, 400),
    own=st.integers(0, 4),
    header=st.sampled_from([None, "Summary of the earlier part: x."]),
)
def test_any_context_with_cache_is_accepted_and_unchanged(
    convo: list[tuple[str, Any]], budget: int, own: int, header: str | None
) -> None:
    ctx = build_context(stored(convo), Segment(note=header))
    before = copy.deepcopy(ctx.messages)
    system = [
        {"type": "text", "text": f"rule {i}", "cache_control": {"type": "ephemeral"}}
        for i in range(own)
    ] or BOT
    kw = ctx.to_anthropic(system=system, tools=TOOLS, cache=True)
    assert check_params(kw) == []
    assert check_messages(kw["messages"], thinking=True) == []
    assert ctx.messages == before
    assert marks(kw) <= 4
