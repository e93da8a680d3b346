"""Context assembly: always valid for the Messages API, cut only at turn boundaries."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextlog.producers.context import (
    THINKING,
    StoredMessage,
    build_context,
    clean_start,
    estimate_tokens,
    trim_start,
)
from tests.support.anthropic_rules import check_messages
from tests.support.blocks import conversation


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


def _stored(convo: list[tuple[str, Any]]) -> list[StoredMessage]:
    return [
        msg(seq, role, content, estimate_tokens(content))
        for seq, (role, content) in enumerate(convo, 1)
    ]


def _thinking_outside_the_current_cycle(messages: list[dict[str, Any]]) -> bool:
    clean = [
        i
        for i, m in enumerate(messages)
        if m["role"] == "user" and not any(b["type"] == "tool_result" for b in m["content"])
    ]
    last = clean[-1] if clean else -1
    return any(
        b["type"] in ("thinking", "redacted_thinking")
        for m in messages[:last]
        for b in m["content"]
    )


@settings(max_examples=400)
@given(
    think=st.booleans(),
    data=st.data(),
    start=st.integers(0, 60),
    budget=st.integers(1, 5000),
)
def test_thinking_and_every_block_type_stay_valid_under_any_cut(
    think: bool, data: st.DataObject, start: int, budget: int
) -> None:
    """A window edge, clear or restore (the window starts anywhere) and a budget cut
    anywhere: the context obeys the API's rules with thinking on or off."""
    log = _stored(data.draw(conversation(think)))
    window = log[start:]
    ctx = build_context(window, budget=budget)
    assert check_messages(ctx.messages, thinking=think) == []
    assert not _thinking_outside_the_current_cycle(ctx.messages)
    blocks = [b for m in ctx.messages for b in m["content"]]
    assert not any("cache_control" in b for b in blocks)
    # Thinking that is kept is the block posted, in the order posted.
    posted = [
        b
        for m in window
        if isinstance(m.content, list)
        for b in m.content
        if b.get("type") in THINKING
    ]
    kept = [b for b in blocks if b["type"] in THINKING]
    assert all(any(k is p for p in posted) for k in kept)
    order = [next(i for i, p in enumerate(posted) if p is k) for k in kept]
    assert order == sorted(order)


def test_thinking_of_finished_turns_is_dropped_and_not_counted() -> None:
    think = {"type": "thinking", "thinking": "x" * 4000, "signature": "sig"}
    log = _stored(
        [
            ("user", "q1"),
            ("assistant", [think, use("a")]),
            ("user", [result("a")]),
            ("assistant", "a1"),
            ("user", "q2"),
            ("assistant", [{**think, "signature": "sig2"}, use("b")]),
            ("user", [result("b")]),
        ]
    )
    ctx = build_context(log, budget=10**6)
    assert ctx.messages[1]["content"] == [use("a")]  # a finished cycle: no thinking
    assert ctx.messages[5]["content"][0]["signature"] == "sig2"  # the current one keeps it
    assert ctx.token_estimate < 2000  # the 1000 tokens of the old thinking do not count
    assert check_messages(ctx.messages, thinking=True) == []


def test_a_window_starting_inside_a_thinking_cycle_starts_after_it() -> None:
    think = {"type": "thinking", "thinking": "plan", "signature": "s"}
    log = _stored(
        [
            ("user", "q1"),
            ("assistant", [think, use("a")]),
            ("user", [result("a"), {"type": "text", "text": "also"}]),
            ("assistant", [use("b")]),  # a continuation: no thinking of its own
            ("user", [result("b")]),
            ("assistant", "done"),
            ("user", "q2"),
        ]
    )
    for start in range(len(log)):
        ctx = build_context(log[start:], budget=10**6)
        assert check_messages(ctx.messages, thinking=True) == []
    assert build_context(log[2:], budget=10**6).messages == [
        {"role": "user", "content": [{"type": "text", "text": "q2"}]}
    ]


def test_cache_control_is_not_kept_in_history() -> None:
    marked = {"type": "text", "text": "big doc", "cache_control": {"type": "ephemeral"}}
    res = {"type": "tool_result", "tool_use_id": "a", "content": [marked]}
    ctx = build_context(
        _stored([("user", [marked] * 5), ("assistant", [use("a")]), ("user", [res])]), budget=10**6
    )
    assert ctx.messages[0]["content"] == [{"type": "text", "text": "big doc"}] * 5
    assert ctx.messages[2]["content"][0]["content"] == [{"type": "text", "text": "big doc"}]
    assert marked["cache_control"] == {"type": "ephemeral"}  # stored blocks are not mutated


def test_over_budget_the_start_moves_in_coarse_steps_and_the_prefix_holds() -> None:
    """Read before each turn of a long conversation: each context's messages are the
    previous one's plus the new turns, byte for byte, except at a trim step; steps are
    rare (half a budget of growth apart) and no context is over budget."""
    history: list[StoredMessage] = []
    budget, previous, steps = 2_000, None, 0
    for turn in range(300):
        seq = len(history)
        history.append(msg(seq + 1, "user", f"question {turn} " + "x" * 200, 60))
        if turn % 3 == 0:  # some turns use a tool
            history.append(msg(seq + 2, "assistant", [use(f"t{turn}")], 20))
            history.append(msg(seq + 3, "user", [result(f"t{turn}")], 20))
        ctx = build_context(history, budget=budget)
        assert ctx.token_estimate <= budget and check_messages(ctx.messages) == []
        if previous is not None:
            grown = json.dumps(ctx.messages[: len(previous)]) == json.dumps(previous)
            steps += not grown
        previous = ctx.messages
        history.append(msg(len(history) + 1, "assistant", f"answer {turn}", 30))
    total = sum(m.tokens for m in history)
    assert 0 < steps <= total // (budget // 2) + 1


@settings(max_examples=300)
@given(log=logs(), budget=st.integers(1, 400), system=st.sampled_from([None, "s" * 200]))
def test_the_tail_the_query_fetches_gives_the_context_of_the_whole_window(
    log: list[StoredMessage], budget: int, system: str | None
) -> None:
    """The window query cuts at the budget's step (`trim_start` without the preamble);
    assembling that tail with its `before` counts equals assembling the whole window."""
    before, run = [], 0
    for m in log:
        before.append(run)
        run += m.tokens
    whole = build_context(log, budget=budget, system=system)
    i = trim_start(before, run, budget, budget)
    tail = log[i:]
    if not any(clean_start(m.role, m.content) for m in tail):
        return  # the reader fetches the whole window then (`reader.complete`)
    part = build_context(tail, budget=budget, system=system, before=before[i:])
    assert part.messages == whole.messages and part.truncated == whole.truncated
    if whole.token_estimate > budget:  # only the newest exchange alone may pass it
        assert len([m for m in whole.messages if m["role"] == "user"]) <= 1 or not any(
            clean_start(m.role, m.content) for m in log
        )
