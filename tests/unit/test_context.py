"""Context assembly: always valid for the Messages API, cut only at turn boundaries."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from producers.context import StoredMessage, build_context, estimate_tokens
from tests.support.anthropic_rules import check_messages


def msg(seq: int, role: str, content: Any, tokens: int = 10) -> StoredMessage:
    return StoredMessage(seq, role, content, tokens)


def use(i: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": i, "name": "lookup", "input": {"q": i}}


def result(i: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": i, "content": "ok"}


@st.composite
def logs(draw: st.DrawFn) -> list[StoredMessage]:
    """Random histories: text, parallel tool calls, answered or not, stray results, blanks."""
    out: list[StoredMessage] = []
    pending: list[str] = []
    n = draw(st.integers(0, 40))
    for seq in range(1, n + 1):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "results", "stray", "blank"]))
        tokens = draw(st.integers(1, 50))
        if kind == "tools":
            ids = [f"t{seq}_{k}" for k in range(draw(st.integers(1, 3)))]
            text = [{"type": "text", "text": "calling"}] if draw(st.booleans()) else []
            out.append(msg(seq, "assistant", text + [use(i) for i in ids], tokens))
            pending = ids
        elif kind == "results" and pending:
            answered = draw(st.lists(st.sampled_from(pending), unique=True))
            extra = [{"type": "text", "text": "and also"}] if draw(st.booleans()) else []
            out.append(msg(seq, "user", [result(i) for i in answered] + extra, tokens))
            pending = []
        elif kind == "stray":
            out.append(msg(seq, "user", [result(f"ghost{seq}")], tokens))
        elif kind == "blank":
            out.append(msg(seq, draw(st.sampled_from(["user", "assistant"])), " ", tokens))
        else:
            role = "user" if kind in ("user", "results") else "assistant"
            out.append(msg(seq, role, draw(st.sampled_from(["hi", "ok ", "done\n"])), tokens))
    return out


@settings(max_examples=400)
@given(log=logs(), start=st.integers(0, 40), budget=st.integers(1, 400))
def test_any_window_of_any_history_gives_a_valid_context(
    log: list[StoredMessage], start: int, budget: int
) -> None:
    window = log[start:]  # the window may start in the middle of a tool exchange
    ctx = build_context(window, budget=budget)
    assert check_messages(ctx.messages) == []
    if ctx.messages:
        assert ctx.first_seq is not None and ctx.first_seq >= (window[0].seq if window else 0)
    assert ctx.truncated or ctx.token_estimate <= sum(m.tokens for m in window)


@given(log=logs())
def test_a_context_that_is_already_valid_is_left_alone(log: list[StoredMessage]) -> None:
    once = build_context(log, budget=10**9)
    again = build_context(
        [msg(i, m["role"], m["content"]) for i, m in enumerate(once.messages)], budget=10**9
    )
    assert again.messages == once.messages


def test_same_role_messages_merge_into_one_turn() -> None:
    ctx = build_context(
        [msg(1, "user", "a"), msg(2, "user", "b"), msg(3, "assistant", "c")], budget=1000
    )
    assert ctx.messages == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
    ]
    assert ctx.token_estimate == 30


def test_window_starting_inside_a_tool_exchange_moves_to_the_next_clean_boundary() -> None:
    log = [
        msg(1, "assistant", [{"type": "text", "text": "let me look"}, use("a")]),
        msg(2, "user", [result("a")]),  # the window starts here: its tool_use is cut off
        msg(3, "assistant", "it is 4C"),
        msg(4, "user", "thanks"),
        msg(5, "assistant", "welcome"),
    ]
    ctx = build_context(log[1:], budget=1000)
    assert [m["role"] for m in ctx.messages] == ["user", "assistant"]
    assert ctx.messages[0]["content"] == [{"type": "text", "text": "thanks"}]
    assert ctx.first_seq == 4


def test_budget_drops_the_oldest_whole_exchanges() -> None:
    log = [
        msg(1, "user", "q1", 100),
        msg(2, "assistant", [use("x")], 100),
        msg(3, "user", [result("x")], 100),
        msg(4, "assistant", "a1", 100),
        msg(5, "user", "q2", 100),
        msg(6, "assistant", "a2", 100),
    ]
    ctx = build_context(log, budget=250)
    assert ctx.truncated and ctx.first_seq == 5 and ctx.token_estimate == 200
    # Never a cut inside the tool exchange, even when that would fit more.
    ctx = build_context(log, budget=350)
    assert ctx.first_seq == 5


def test_unanswered_tool_use_and_orphan_results_are_dropped() -> None:
    ctx = build_context(
        [
            msg(1, "user", "go"),
            msg(2, "assistant", [{"type": "text", "text": "two calls"}, use("a"), use("b")]),
            msg(3, "user", [result("a"), result("zzz"), {"type": "text", "text": "only a"}]),
            msg(4, "assistant", [use("c")]),  # trailing call, never answered
        ],
        budget=1000,
    )
    assert check_messages(ctx.messages) == []
    assert ctx.messages[1]["content"] == [{"type": "text", "text": "two calls"}, use("a")]
    assert ctx.messages[2]["content"] == [result("a"), {"type": "text", "text": "only a"}]
    assert len(ctx.messages) == 3


def test_to_anthropic_omits_an_empty_system() -> None:
    ctx = build_context([msg(1, "user", "hi")], budget=100)
    assert ctx.to_anthropic() == {"messages": ctx.messages}
    ctx = build_context([msg(1, "user", "hi")], budget=100, system="thread t2 is active")
    assert ctx.to_anthropic()["system"] == "thread t2 is active"


def test_estimate_tokens_is_about_four_characters_a_token() -> None:
    assert estimate_tokens("x" * 400) == 100
    assert estimate_tokens([{"type": "text", "text": "x" * 40}, result("a")]) == 10
