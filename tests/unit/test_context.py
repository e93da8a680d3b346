"""Context assembly of a thread's segment: always valid for the Messages API, append-only
between boundaries, thinking kept, system messages in place, the API's compaction first."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextlog.producers.context import (
    THINKING,
    Frame,
    Segment,
    StoredMessage,
    SystemMessages,
    build_context,
    compaction_split,
    estimate_tokens,
)
from tests.support import properties
from tests.support.anthropic_rules import check_messages
from tests.support.appendonly import extends
from tests.support.blocks import conversation, server_call, thinking


def msg(seq: int, role: str, content: Any, tokens: int = 10) -> StoredMessage:
    return StoredMessage(seq, role, content, tokens)


def use(i: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": i, "name": "lookup", "input": {"q": i}}


def result(i: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": i, "content": "ok"}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def stored(convo: list[tuple[str, Any]], first: int = 1) -> list[StoredMessage]:
    return [
        msg(seq, role, content, estimate_tokens(content))
        for seq, (role, content) in enumerate(convo, first)
    ]


@st.composite
def with_system(draw: st.DrawFn, think: bool) -> list[tuple[str, Any]]:
    """A bot's conversation with mid-conversation system messages posted anywhere."""
    convo = draw(conversation(think))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(convo)))
        note = draw(st.sampled_from(["Today is Tuesday.", " ", [text("Mode: terse.")]]))
        convo.insert(at, ("system", note))
    return convo


def _thinking(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for m in messages for b in m["content"] if b.get("type") in THINKING]


@settings(max_examples=properties.examples(300))
@given(
    think=st.booleans(),
    data=st.data(),
    start=st.integers(0, 60),
    fold=st.booleans(),
)
def test_any_segment_of_any_history_is_valid_and_keeps_its_thinking_in_order(
    think: bool, data: st.DataObject, start: int, fold: bool
) -> None:
    """A segment may start anywhere (a restore, a log written before segments): the
    context obeys the API's rules with thinking on or off, with system messages kept or
    folded, and every thinking block it sends is one posted, in the order posted. (Where
    ingest lets a boundary remove thinking, never inside a tool-use cycle, is its rule:
    the integration tests check it against the API's cycle rule.)"""
    log = stored(data.draw(with_system(think)))[start:]
    strip = data.draw(st.sampled_from([0, data.draw(st.integers(0, len(log) + start))]))
    ctx = build_context(
        log, Segment(strip_through=strip), system_messages="fold" if fold else "keep"
    )
    cycle = think if strip == 0 else None
    assert check_messages(ctx.messages, thinking=cycle, system_messages=not fold) == []
    posted = [
        b
        for m in log
        if m.seq > strip and isinstance(m.content, list)
        for b in m.content
        if b.get("type") in THINKING
    ]
    kept = _thinking(ctx.messages)
    order = [next(i for i, p in enumerate(posted) if p is k) for k in kept]
    assert order == sorted(order)
    assert not any("cache_control" in b for m in ctx.messages for b in m["content"])


@settings(max_examples=properties.examples(300))
@given(think=st.booleans(), data=st.data(), fold=st.booleans())
def test_reads_of_a_growing_segment_only_ever_grow_at_their_end(
    think: bool, data: st.DataObject, fold: bool
) -> None:
    """Read after every message of a conversation: each context extends the one before
    (docs/context.md), and the thinking of every earlier cycle comes back."""
    log = stored(data.draw(with_system(think)))
    mode: SystemMessages = "fold" if fold else "keep"
    previous: list[dict[str, Any]] = []
    for k in range(len(log) + 1):
        ctx = build_context(log[:k], Segment(), system_messages=mode)
        assert extends(previous, ctx.messages) == "", k
        previous = ctx.messages


def test_thinking_of_every_cycle_comes_back_verbatim_and_counts() -> None:
    think = {"type": "thinking", "thinking": "", "signature": "s" * 4000}  # Fable 5.1's form
    log = stored(
        [
            ("user", "q1"),
            ("assistant", [think, use("a")]),
            ("user", [result("a")]),
            ("assistant", [{**think, "signature": "t" * 4000}, text("a1")]),
            ("user", "q2"),
        ]
    )
    ctx = build_context(log)
    assert _thinking(ctx.messages) == [think, {**think, "signature": "t" * 4000}]
    assert ctx.messages[1]["content"][0] is log[1].content[0]  # the block as posted
    assert ctx.token_estimate >= 2 * 3000 // 4  # the model reads it: it counts
    assert ctx.thinking_removed == 0
    assert check_messages(ctx.messages, thinking=True) == []


def test_a_boundary_removes_the_kept_turns_thinking_in_one_step_and_says_so() -> None:
    log = stored(
        [
            ("user", "q1"),
            ("assistant", [thinking("1"), text("a1")]),
            ("user", "q2"),
            ("assistant", [thinking("2"), use("b")]),
            ("user", [result("b")]),
            ("assistant", [thinking("3"), text("a2")]),
        ]
    )
    ctx = build_context(log, Segment(strip_through=3, boundary="budget", boundaries=4))
    assert _thinking(ctx.messages) == [thinking("2"), thinking("3")]
    assert ctx.thinking_removed == 1
    assert ctx.boundary is not None and (ctx.boundary.kind, ctx.boundary.count) == ("budget", 4)
    assert ctx.truncated


def test_system_messages_follow_the_user_turn_they_came_after() -> None:
    log = stored(
        [
            ("user", "q1"),
            ("system", "Today is Tuesday."),
            ("assistant", "a1"),
            ("system", "It is 10:00."),  # after an assistant turn: waits for the next user
            ("user", "q2"),
            ("user", "q3"),  # merged into the user turn; the system message stays after it
        ]
    )
    ctx = build_context(log)
    assert ctx.messages == [
        {"role": "user", "content": [text("q1")]},
        {"role": "system", "content": [text("Today is Tuesday.")]},
        {"role": "assistant", "content": [text("a1")]},
        {"role": "user", "content": [text("q2"), text("q3")]},
        {"role": "system", "content": [text("It is 10:00.")]},
    ]
    assert check_messages(ctx.messages) == []
    assert check_messages(ctx.messages, system_messages=False) != []  # older models
    folded = build_context(log, system_messages="fold").messages
    assert check_messages(folded, system_messages=False) == []
    assert folded[2]["content"] == [
        text("<system>\nIt is 10:00.\n</system>"),
        text("q2"),
        text("q3"),
    ]


def test_a_system_message_first_waits_for_the_first_user_turn() -> None:
    ctx = build_context(stored([("system", "Be brief."), ("user", "hi")]))
    assert [m["role"] for m in ctx.messages] == ["user", "system"]
    assert build_context(stored([("system", "Be brief.")])).messages == []


def test_the_apis_compaction_block_starts_the_context_and_nothing_before_it_is_sent() -> None:
    block = {"type": "compaction", "content": "We fixed the login bug.", "signature": "c"}
    log = stored(
        [
            ("assistant", [text("ignored by the API"), block, thinking("9"), text("go on")]),
            ("user", "next"),
        ]
    )
    ctx = build_context(log)
    assert ctx.messages[0] == {
        "role": "assistant",
        "content": [block, thinking("9"), text("go on")],
    }
    assert ctx.compacted and check_messages(ctx.messages) == []
    # The worker's on-demand block: the segment starts with it, the kept turns follow.
    kept = stored([("user", "q5"), ("assistant", [thinking("5"), text("a5")])], first=20)
    ctx = build_context(kept, Segment(start=20, block=block))
    assert ctx.messages[0] == {"role": "assistant", "content": [block]}
    assert _thinking(ctx.messages) == [thinking("5")]
    assert check_messages(ctx.messages) == []
    # A null block (a compaction that produced nothing) is a no-op: kept where it is.
    null = {"type": "compaction", "content": None}
    ctx = build_context(stored([("user", "q"), ("assistant", [null, text("a")])]))
    assert ctx.messages[1]["content"] == [null, text("a")]


def test_a_compaction_cuts_before_the_newest_exchange_after_a_finished_answer() -> None:
    log = stored(
        [
            ("user", "q1"),
            ("assistant", [thinking("1"), use("a")]),
            ("user", [result("a")]),
            ("assistant", [thinking("2"), text("a1")]),
            ("user", "q2"),
            ("system", "note"),
            ("assistant", [thinking("3"), use("b")]),
            ("user", [result("b")]),  # inside a cycle: never a cut here
        ]
    )
    ctx = build_context(log)
    assert compaction_split(ctx) == (4, 4)  # messages[:4] summarised, through seq 4
    assert compaction_split(build_context(log[:2])) is None  # nothing before the newest


def test_a_server_tool_use_without_its_result_is_left_out() -> None:
    call, found = server_call("7")
    log = stored(
        [
            ("user", "q"),
            ("assistant", [thinking("1"), call, use("a")]),  # paused, and a client call
            ("user", [result("a")]),
            ("assistant", [text("done")]),
        ]
    )
    ctx = build_context(log)
    assert ctx.messages[1]["content"] == [thinking("1"), use("a")]
    assert check_messages(ctx.messages) == []
    # Continued in a second message, the pair is whole again in the merged turn.
    both = build_context(
        stored([("user", "q"), ("assistant", [thinking("1"), call]), ("assistant", [found])])
    )
    assert both.messages[1]["content"] == [thinking("1"), call, found]


def test_the_header_and_the_frame() -> None:
    seg = Segment(note="Resumed saved session s1.", summary="We talked.", threads=("", "b"))
    frame = Frame("claude-fable-5-1", "You are a bot.", [{"name": "lookup"}])
    ctx = build_context(stored([("user", "hi")]), seg, frame=frame)
    assert ctx.system == (
        "Resumed saved session s1.\n\nSummary of the earlier part of this conversation: We"
        " talked.\n\nOther active threads in this conversation:\n- main line\n- thread b"
    )
    kw = ctx.to_anthropic()  # the registered frame: the bot's system first, then ours
    assert kw["system"] == [text("You are a bot."), text(ctx.system)]
    assert kw["tools"] == [{"name": "lookup"}]
    assert build_context(stored([("user", "hi")])).to_anthropic() == {
        "messages": [{"role": "user", "content": [text("hi")]}]
    }


def test_unanswered_tool_use_and_orphan_results_are_dropped() -> None:
    ctx = build_context(
        stored(
            [
                ("user", "go"),
                ("assistant", [text("two calls"), use("a"), use("b")]),
                ("user", [result("a"), result("zzz"), text("only a")]),
                ("assistant", [use("c")]),  # trailing call, never answered
            ]
        )
    )
    assert check_messages(ctx.messages) == []
    assert ctx.messages[1]["content"] == [text("two calls"), use("a")]
    assert ctx.messages[2]["content"] == [result("a"), text("only a")]
    assert len(ctx.messages) == 3


def test_cache_control_is_not_kept_in_history() -> None:
    marked = {"type": "text", "text": "big doc", "cache_control": {"type": "ephemeral"}}
    res = {"type": "tool_result", "tool_use_id": "a", "content": [marked]}
    ctx = build_context(
        stored([("user", [marked] * 5), ("assistant", [use("a")]), ("user", [res])])
    )
    assert ctx.messages[0]["content"] == [text("big doc")] * 5
    assert ctx.messages[2]["content"][0]["content"] == [text("big doc")]
    assert marked["cache_control"] == {"type": "ephemeral"}  # stored blocks are not mutated


def test_over_budget_only_when_a_cycle_grew_past_it() -> None:
    ctx = build_context(stored([("user", "x" * 800)]), Segment(budget=100))
    assert ctx.over_budget and not ctx.truncated


def test_estimate_tokens_is_about_four_characters_a_token() -> None:
    assert estimate_tokens("x" * 400) == 100
    assert estimate_tokens([text("x" * 40), result("a")]) == 10
    # Thinking counts its signature (the newest models carry the reasoning there).
    assert estimate_tokens([{"type": "thinking", "thinking": "", "signature": "s" * 400}]) == 75
