"""Turn a thread's segment of stored messages into a context the Messages API accepts.

Pure functions of their inputs; docs/context.md is the contract. A thread's context is its
*segment* (`Segment`): the messages from the segment's start, in log order, each as it was
posted, behind a header (`system`) frozen when the segment began. Ingest decides where a
segment starts (migration 014), only at a *boundary*: a clear, a restore, a compaction
landing, the budget or the rolling window moving the start at an opening user message,
the bot's frame changing. Between two boundaries every read returns the previous read's
messages unchanged with new ones at the end, so the prefix that Claude's newest models
bind each thinking block to (system, tools, every earlier message) holds, and the prompt
cache serves all but the end.

Thinking (`thinking`, `redacted_thinking`) comes back verbatim from every cycle, and counts
against the budget: the newest models read it. Only at a boundary that changed what
precedes the kept turns (not the API's own compaction) is it removed from them, in one
step: the messages up to `strip_through`. Beyond that, what the API refuses is repaired
the same way on every read (so the prefix holds): the first turn is a user turn (or the
API's compaction block); consecutive user or assistant messages are merged; every
`tool_use` is answered by its `tool_result` in the next user turn and no result is
without its call; a server tool use without its result is left out; an assistant turn
that holds thinking starts with it; blank text goes; a final assistant turn does not end
in white space. Mid-conversation system messages come back where they were posted: after
the user turn they follow (one that follows an assistant turn waits for the next user
turn, as the API requires), merged when several follow one turn, or folded into that user
turn as text (`system_messages="fold"`) for models that refuse the role.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

from contextlog.producers import prompt
from contextlog.schema import blocks as contract

Block = dict[str, Any]
THINKING: Final = contract.THINKING
COMPACTION: Final = contract.COMPACTION
SystemMessages = Literal["keep", "fold"]

# The budget's rules, in one home (ingest's boundary decisions take them as parameters,
# migration 014): a compaction job is queued when a segment passes COMPACT_AT of the
# budget; at an opening user message past CUT_AT, the start moves by whole steps of half
# the budget until it is back under CUT_AT, which leaves a quarter of the budget for the
# tool-use cycle the message opens. The rolling window's edge moves in steps of
# EDGE_STEP of the window (a quarter: at most four edge boundaries a day).
COMPACT_AT: Final = 0.5
CUT_AT: Final = 0.75
EDGE_STEP: Final = 0.25


class StoredMessage(NamedTuple):
    """One message of the segment as the read model returns it (a tuple: cheap to make)."""

    seq: int
    role: str
    content: str | list[Block]
    tokens: int
    occurred_at: dt.datetime | None = None


@dataclass(frozen=True)
class Segment:
    """What the read model keeps of a thread's segment (`threads`, migration 014)."""

    boundaries: int = 0  # boundaries the thread crossed: the segment's identity
    start: int = 0
    strip_through: int = 0  # thinking of messages up to this seq is removed
    note: str | None = None  # a restored session's, an auto-save's
    summary: str | None = None  # our own summary of the older part
    threads: Sequence[str] = ()  # the conversation's other active threads
    block: Block | None = None  # the API's compaction block the segment starts with
    boundary: str | None = None  # the last boundary's kind
    boundary_seq: int | None = None
    budget: int = 0
    start_at: dt.datetime | None = None


@dataclass(frozen=True)
class Boundary:
    """The last boundary a thread crossed: what an adapter may log."""

    kind: str  # clear, restore, budget, edge, compaction, summary, frame, upgrade
    seq: int | None  # the log position where it fell
    count: int  # boundaries the thread crossed so far


@dataclass(frozen=True)
class Frame:
    """The bot's own request frame, as registered with `Producer.set_frame`."""

    model: str
    system: str | list[Block] | None = None
    tools: list[Block] | None = None
    thinking: Block | None = None  # the `thinking` request parameter


@dataclass
class Turn:
    """Consecutive messages of one role, merged; `tokens` is their estimate."""

    role: str
    blocks: list[Block]
    tokens: int = 0
    first_seq: int = 0
    # System messages that follow this (user) turn, merged; or, on an assistant turn, the
    # ones waiting for the next user turn.
    after: list[Block] = field(default_factory=list)
    after_tokens: int = 0


@dataclass(frozen=True)
class Context:
    """What an adapter sends to `anthropic.messages.create`."""

    messages: list[dict[str, Any]]
    system: str | None = None  # our header: changes only at a boundary
    token_estimate: int = 0
    truncated: bool = False  # the budget moved the segment's start
    window_start: dt.datetime | None = None
    first_seq: int | None = field(default=None, compare=False)
    # The thread's older part was compacted: our summary is in `system`, or the messages
    # start with the API's compaction block.
    compacted: bool = False
    # Which Postgres served the read: "primary", or "replica" (producers/replica.py).
    served_by: str = field(default="primary", compare=False)
    boundary: Boundary | None = None
    # Thinking blocks left out of this context because a boundary changed their prefix
    # (or they were out of place): log it when the boundary is new.
    thinking_removed: int = 0
    over_budget: bool = False  # a tool-use cycle grew past the budget (never cut)
    last_seq: int | None = field(default=None, compare=False)  # the log position read up to
    frame: Frame | None = field(default=None, compare=False)
    # The log position of each message's first part (None: a system message): where a
    # compaction may cut (`compaction_split`).
    seqs: tuple[int | None, ...] = field(default=(), compare=False, repr=False)

    def to_anthropic(
        self,
        *,
        system: str | Sequence[Block] | None = None,
        tools: Sequence[Block] | None = None,
        cache: bool = False,
    ) -> dict[str, Any]:
        """Keyword arguments for `client.messages.create(model=..., max_tokens=..., **kw)`,
        in the order the API caches them: tools, system, messages. The bot's own `system`
        (a string or text blocks) and `tools` pass through byte for byte (the registered
        frame's when not given) and our header follows the bot's system, so a new header
        (a boundary) leaves the bot's tools and prompt cached. `cache=True` adds
        `cache_control` breakpoints (see `producers/prompt.py`)."""
        if system is None and self.frame is not None:
            system = self.frame.system
        if tools is None and self.frame is not None:
            tools = self.frame.tools
        return prompt.request(self.messages, self.system, system=system, tools=tools, cache=cache)


def estimate_tokens(content: str | Sequence[Block]) -> int:
    """A cheap token estimate: about four characters a token (`schema.blocks.estimate`
    says what each block type counts)."""
    if isinstance(content, str):
        return max(1, len(content) // 4)
    chars = sum(contract.estimate(b) for b in content if isinstance(b, dict))
    return max(1, chars // contract.CHARS_PER_TOKEN)


def _blank(text: object) -> bool:
    return not isinstance(text, str) or not text or text.isspace()


def _blocks(content: str | list[Block]) -> list[Block]:
    """Content as blocks, without blank text (the API refuses it) and without
    `cache_control` (breakpoints are the adapter's per request choice, and the prefix
    check ignores them). Blocks are shared, never mutated in place: a change replaces
    the block."""
    if isinstance(content, str):
        return [] if _blank(content) else [{"type": "text", "text": content}]
    return [_uncached(b) for b in content if b.get("type") != "text" or not _blank(b.get("text"))]


def _uncached(block: Block) -> Block:
    """The block without cache breakpoints (in a tool result's content too)."""
    if "cache_control" in block:
        block = {k: v for k, v in block.items() if k != "cache_control"}
    inner = block.get("content")
    if (
        block.get("type") == "tool_result"
        and isinstance(inner, list)
        and any(isinstance(b, dict) and "cache_control" in b for b in inner)
    ):
        block = {**block, "content": [_uncached(b) for b in inner]}
    return block


@dataclass
class _Stripped:
    """Thinking blocks a read left out, counted."""

    count: int = 0


def strip_thinking(
    messages: Iterable[StoredMessage], through: int, removed: _Stripped
) -> list[StoredMessage]:
    """The messages with the thinking of those up to seq `through` removed (a boundary
    changed their prefix), counted in `removed`."""
    out = []
    for m in messages:
        content = m.content
        if m.seq <= through and m.role == "assistant" and not isinstance(content, str):
            kept = [b for b in content if b.get("type") not in THINKING]
            if len(kept) != len(content):
                removed.count += len(content) - len(kept)
                m = m._replace(content=kept, tokens=estimate_tokens(kept) if kept else 0)
        out.append(m)
    return out


def from_compaction(messages: Sequence[StoredMessage]) -> Sequence[StoredMessage]:
    """A segment that holds an assistant message with the API's compaction block starts
    at the newest such block (ingest starts a segment there; a restored session may hold
    one anywhere): the API ignores whatever comes before it."""
    at = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if messages[i].role == "assistant"
            and not isinstance(messages[i].content, str)
            and contract.starts_anew(messages[i].content)
        ),
        None,
    )
    if at is None:
        return messages
    content = messages[at].content
    j = max(k for k, b in enumerate(content) if contract.starts_anew([b]))
    first = messages[at]
    if j > 0:
        kept = content[j:]
        first = first._replace(content=kept, tokens=estimate_tokens(kept))
    return [first, *messages[at + 1 :]]


def merge_turns(
    messages: Iterable[StoredMessage], system_messages: SystemMessages = "keep"
) -> list[Turn]:
    """Consecutive same-role messages become one turn, blank text dropped. A system
    message is kept for after the user turn it follows (`Turn.after`; one that follows an
    assistant turn waits there for the next user turn), or folded in place into the user
    turn as text (`fold`)."""
    turns: list[Turn] = []
    waiting: list[Block] = []  # folded system messages for the next user turn
    for m in messages:
        content = m.content
        if isinstance(content, str):  # the common case, inlined: this loop is the hot path
            if not content or content.isspace():
                continue
            blocks: list[Block] = [{"type": "text", "text": content}]
        else:
            blocks = _blocks(content)
            if not blocks:
                continue
        if m.role == "system":
            if system_messages == "fold":
                folded = [_folded(blocks)]
                if turns and turns[-1].role == "user":
                    turns[-1].blocks += folded
                    turns[-1].tokens += m.tokens
                else:
                    waiting += folded
            elif turns:
                turns[-1].after += blocks
                turns[-1].after_tokens += m.tokens
            else:
                turns.append(Turn("system", [], 0, m.seq, blocks, m.tokens))
            continue
        if m.role == "user" and waiting:
            blocks, waiting = waiting + blocks, []
        if turns and turns[-1].role == m.role:
            turns[-1].blocks += blocks
            turns[-1].tokens += m.tokens
        else:
            turns.append(Turn(m.role, blocks, m.tokens, m.seq))
    return turns


def _tool_ids(turn: Turn) -> list[str]:
    return [b["id"] for b in turn.blocks if b.get("type") == "tool_use"]


def _pair_tools(turns: list[Turn]) -> list[Turn]:
    """Keep a tool_use only if the next user turn answers it, and a result only if asked."""
    seen: set[str] = set()
    for i, turn in enumerate(turns):
        if turn.role == "assistant":
            nxt = turns[i + 1] if i + 1 < len(turns) and turns[i + 1].role == "user" else None
            answered = {
                b["tool_use_id"]
                for b in (nxt.blocks if nxt else [])
                if b.get("type") == "tool_result"
            }
            kept = []
            for b in turn.blocks:
                if b.get("type") == "tool_use":
                    if b["id"] in seen or b["id"] not in answered:
                        continue
                    seen.add(b["id"])
                kept.append(b)
            turn.blocks = kept
        else:
            asked = (
                set(_tool_ids(turns[i - 1]))
                if i > 0 and turns[i - 1].role == "assistant"
                else set()
            )
            results, others, done = [], [], set()
            for b in turn.blocks:
                if b.get("type") == "tool_result":
                    if b["tool_use_id"] in asked and b["tool_use_id"] not in done:
                        done.add(b["tool_use_id"])
                        results.append(b)
                else:
                    others.append(b)
            turn.blocks = results + others  # the API wants tool results first
    return turns


def _server_tools(turns: list[Turn]) -> list[Turn]:
    """A server tool use without its result in the same turn (a paused turn stored as it
    came, beside a client call that was never answered) is left out, and so is a result
    without its use."""
    for turn in turns:
        if turn.role != "assistant":
            continue
        uses = {b.get("id") for b in turn.blocks if b.get("type") == "server_tool_use"}
        results = {
            b.get("tool_use_id") for b in turn.blocks if b.get("type") in contract.SERVER_RESULTS
        }
        if uses == results:
            continue
        turn.blocks = [
            b
            for b in turn.blocks
            if not (b.get("type") == "server_tool_use" and b.get("id") not in results)
            and not (b.get("type") in contract.SERVER_RESULTS and b.get("tool_use_id") not in uses)
        ]
    return turns


def _normalise(turns: list[Turn]) -> list[Turn]:
    """Drop empty turns, re-merge neighbours of one role, start with a user turn or the
    API's compaction block. The system messages after a dropped user turn stay after the
    turn before it; after a dropped assistant turn they wait for the next turn, as they
    would have (they came after it in the log)."""
    out: list[Turn] = []
    carried: list[Block] = []
    carried_tokens = 0
    for t in turns:
        if not t.blocks or (not out and t.role != "user" and not _opens_with_compaction(t)):
            if t.role == "user" and out:
                out[-1].after += t.after
                out[-1].after_tokens += t.after_tokens
            else:
                carried += t.after
                carried_tokens += t.after_tokens
            continue
        if carried:
            t.after[:0], carried = carried, []
            t.after_tokens += carried_tokens
            carried_tokens = 0
        if out and out[-1].role == t.role:
            out[-1].blocks += t.blocks
            out[-1].tokens += t.tokens
            out[-1].after += t.after
            out[-1].after_tokens += t.after_tokens
        else:
            out.append(t)
    return out


def _opens_with_compaction(turn: Turn) -> bool:
    return turn.role == "assistant" and turn.blocks[0].get("type") == COMPACTION


def repair(turns: list[Turn], removed: _Stripped | None = None) -> list[Turn]:
    """Apply the pairing, server tool and thinking rules until nothing changes."""
    removed = removed or _Stripped()
    if not any(b.get("type") != "text" for t in turns for b in t.blocks):
        turns = _normalise(turns)  # no tool blocks: only alternation and the first turn
    else:
        while True:
            before = [(t.role, len(t.blocks)) for t in turns]
            turns = _normalise(_thinking(_server_tools(_pair_tools(turns)), removed))
            if [(t.role, len(t.blocks)) for t in turns] == before:
                break
    if turns and turns[-1].role == "assistant":
        _strip_trailing_space(turns[-1])
        if not turns[-1].blocks:  # it held only white space
            turns = _normalise(turns)
    return turns


def _clean(turn: Turn) -> bool:
    """A user turn that answers no tool call: where a tool-use cycle ends."""
    return (
        turn.role == "user"
        and bool(turn.blocks)
        and not any(b.get("type") == "tool_result" for b in turn.blocks)
    )


def _thinking(turns: list[Turn], removed: _Stripped) -> list[Turn]:
    """An assistant turn that holds thinking starts with it (merged after other content:
    what came before the thinking goes), and thinking never stands alone (without the
    answer or tool use it preceded, the turn goes)."""
    for turn in turns:
        if turn.role != "assistant" or not any(b.get("type") in THINKING for b in turn.blocks):
            continue
        # A leading compaction block stands for what came before: the rules hold after it.
        lead = 1 if turn.blocks[0].get("type") == COMPACTION else 0
        kept = turn.blocks[lead:]
        if kept[0].get("type") not in THINKING:
            kept = kept[next(j for j, b in enumerate(kept) if b.get("type") in THINKING) :]
        if all(b.get("type") in THINKING for b in kept):
            removed.count += len(kept)
            kept = []
        _replace(turn, turn.blocks[:lead] + kept)
    return turns


def _replace(turn: Turn, kept: list[Block]) -> None:
    if len(kept) != len(turn.blocks):
        turn.blocks = kept
        turn.tokens = estimate_tokens(kept) if kept else 0


def from_cycle_end(messages: Sequence[StoredMessage]) -> Sequence[StoredMessage]:
    """A segment whose start falls inside a tool-use cycle (a restored session, a log
    written before segments, a bot's late answer after a clear) leaves that cycle out: its
    messages from the first assistant message up to the first user message that answers
    no tool call. What precedes that assistant message stays (system messages, and the
    text that came with stray results; repair drops the results), so a read taken before
    the cycle's end is extended, never retracted, by the reads after it."""
    if messages and messages[0].role == "assistant" and _compaction_first(messages[0]):
        return messages
    j = next((j for j, m in enumerate(messages) if m.role == "assistant"), None)
    if j is None or any(clean_start(m.role, m.content) for m in messages[:j]):
        return messages  # the first cycle starts in the segment
    after = messages[j + 1 :]
    opens = next((k for k, m in enumerate(after) if clean_start(m.role, m.content)), len(after))
    return [*messages[:j], *after[opens:]]


def _compaction_first(m: StoredMessage) -> bool:
    return not isinstance(m.content, str) and contract.starts_anew(m.content[:1])


def _strip_trailing_space(turn: Turn) -> None:
    """The API refuses a final assistant turn that ends with white space."""
    while turn.blocks and turn.blocks[-1].get("type") == "text":
        text = str(turn.blocks[-1]["text"]).rstrip()
        if text:
            turn.blocks[-1] = {**turn.blocks[-1], "text": text}
            return
        turn.blocks.pop()


def units(turns: list[Turn]) -> list[list[Turn]]:
    """Exchanges: a unit starts at each user turn that answers no tool call."""
    out: list[list[Turn]] = []
    for t in turns:
        if _clean(t) or not out:
            out.append([t])
        else:
            out[-1].append(t)
    return out


def clean_start(role: str, content: str | list[Block]) -> bool:
    """A stored message where an exchange can start: a user message that answers no
    tool call and holds something."""
    if role != "user":
        return False
    if isinstance(content, str):
        return not _blank(content)
    return bool(_blocks(content)) and not any(b.get("type") == "tool_result" for b in content)


def _messages(turns: list[Turn]) -> tuple[list[dict[str, Any]], tuple[int | None, ...]]:
    """The turns as the API's messages: each user turn followed by the system messages
    that came after it, an assistant turn's carried to the next user turn (the API
    takes a system message only after a user turn, last or before an assistant turn);
    and each message's first log position."""
    out: list[dict[str, Any]] = []
    seqs: list[int | None] = []
    carried: list[Block] = []
    for t in turns:
        if t.role == "assistant":
            out.append({"role": "assistant", "content": t.blocks})
            seqs.append(t.first_seq)
            carried += t.after
            continue
        after, carried = carried + t.after, []
        out.append({"role": "user", "content": t.blocks})
        seqs.append(t.first_seq)
        if after:
            out.append({"role": "system", "content": after})
            seqs.append(None)
    return out, tuple(seqs)


def _folded(system: list[Block]) -> Block:
    """A system message as a text block of a user turn, for models without the role."""
    text = "\n\n".join(str(b.get("text", "")) for b in system if b.get("type") == "text")
    return {"type": "text", "text": f"<system>\n{text}\n</system>"}


def header(segment: Segment) -> str | None:
    """Our additions for the segment, frozen with it: the resumed session (or the auto
    save before it), our summary of the older part, the other active threads."""
    parts = [p for p in (segment.note, _summary(segment.summary)) if p]
    if segment.threads:
        lines = ["Other active threads in this conversation:"]
        lines += ["- main line" if t == "" else f"- thread {t}" for t in sorted(segment.threads)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) or None


def _summary(summary: str | None) -> str | None:
    return f"Summary of the earlier part of this conversation: {summary}" if summary else None


def build_context(
    messages: Iterable[StoredMessage],
    segment: Segment | None = None,
    *,
    system_messages: SystemMessages = "keep",
    frame: Frame | None = None,
    last_seq: int | None = None,
) -> Context:
    """The context of a thread's segment (its messages oldest first), valid for the
    Messages API; see the module doc for what is repaired and how."""
    segment = segment or Segment()
    removed = _Stripped()
    window = strip_thinking(messages, segment.strip_through, removed)
    if segment.block is not None:
        window = [StoredMessage(segment.start - 1, "assistant", [segment.block], 0), *window]
    turns = repair(merge_turns(from_cycle_end(from_compaction(window)), system_messages), removed)
    system = header(segment)
    tokens = (estimate_tokens(system) if system else 0) + sum(
        t.tokens + t.after_tokens for t in turns
    )
    if segment.block is not None:
        tokens += estimate_tokens([segment.block])
    out, seqs = _messages(turns)
    return Context(
        messages=out,
        system=system,
        token_estimate=tokens,
        truncated=segment.boundary == "budget",
        window_start=segment.start_at,
        first_seq=turns[0].first_seq if turns else None,
        compacted=bool(segment.summary or segment.block)
        or bool(turns and _opens_with_compaction(turns[0])),
        boundary=Boundary(segment.boundary, segment.boundary_seq, segment.boundaries)
        if segment.boundary
        else None,
        thinking_removed=removed.count,
        over_budget=bool(segment.budget) and tokens > segment.budget,
        last_seq=last_seq,
        frame=frame,
        seqs=seqs,
    )


def compaction_split(ctx: Context) -> tuple[int, int] | None:
    """Where a compaction of the context may cut: (k, seq) with the first k messages to
    summarise and the rest kept, or None. The kept part starts at the newest user turn
    that opens an exchange and follows an assistant turn: the summarised messages end on
    a finished answer (no tool call waits for a result), and the first kept message has
    the other role, as the API's compaction requires for kept thinking to stay valid.
    `seq`: the log position of the last summarised message (the one before it)."""
    for k in range(len(ctx.messages) - 1, 0, -1):
        m, seq = ctx.messages[k], ctx.seqs[k]
        if (
            seq is not None
            and m["role"] == "user"
            and ctx.messages[k - 1]["role"] == "assistant"
            and not any(b.get("type") == "tool_result" for b in m["content"])
        ):
            return k, seq - 1
    return None
