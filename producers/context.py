"""Turn a window of stored messages into a context the Anthropic Messages API accepts.

Pure functions of their inputs. The rules (DESIGN invariant 6): the first turn is a
user turn; roles alternate (consecutive same-role messages are merged); every
`tool_use` is answered by its `tool_result` in the next user turn; no `tool_result`
without its `tool_use`; cuts happen only at turn boundaries. Beyond that, what the API
refuses is also repaired: empty or blank text blocks, a tool id used twice, trailing
white space at the end of a final assistant turn.

Thinking (`thinking`, `redacted_thinking`) follows the API's rules: the API reads thinking
only in the current tool-use cycle (the turns after the last user turn that answers no
tool call) and must get it back there verbatim, first in that cycle's assistant turn;
thinking of earlier, finished turns is ignored by the API and not counted in its context
window, so it is left out here too (its tokens do not count against the budget, and
models that bind thinking to its prefix want earlier thinking dropped when older turns
are cut). A window that begins inside a tool-use cycle (a window edge, a clear, a
restore landing there) starts at the cycle's end instead, so a cycle's thinking is never
separated from the tool use it preceded. `cache_control` is dropped from every block:
breakpoints are the adapter's per request choice and would pile up in history.

Budget trims keep the prompt cache warm (DESIGN invariant 9): the window's start moves
in steps of half the budget (`trim_start`), a pure function of the stored window, so
consecutive reads share their whole earlier prefix and one trim serves many turns; the
window query makes the same cut in SQL and fetches only what it keeps.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from contextlog.producers import prompt
from contextlog.schema import blocks as contract

Block = dict[str, Any]
THINKING: Final = contract.THINKING


class StoredMessage(NamedTuple):
    """One message of the window as the read model returns it (a tuple: cheap to make)."""

    seq: int
    role: str
    content: str | list[Block]
    tokens: int
    occurred_at: dt.datetime | None = None


@dataclass
class Turn:
    """Consecutive messages of one role, merged; `tokens` is their estimate."""

    role: str
    blocks: list[Block]
    tokens: int = 0
    first_seq: int = 0


@dataclass(frozen=True)
class Context:
    """What an adapter sends to `anthropic.messages.create`."""

    messages: list[dict[str, Any]]
    system: str | None = None
    token_estimate: int = 0
    truncated: bool = False
    window_start: dt.datetime | None = None
    first_seq: int | None = field(default=None, compare=False)
    # The thread's older part was compacted: its summary is in `system`, and the
    # messages are what came after it.
    compacted: bool = False
    # Which Postgres served the read: "primary", or "replica" (producers/replica.py).
    served_by: str = field(default="primary", compare=False)

    def to_anthropic(
        self,
        *,
        system: str | Sequence[Block] | None = None,
        tools: Sequence[Block] | None = None,
        cache: bool = False,
    ) -> dict[str, Any]:
        """Keyword arguments for `client.messages.create(model=..., max_tokens=..., **kw)`,
        in the order the API caches them: tools, system, messages. The bot's own `system`
        (a string or text blocks) comes first and our preamble after it, so a new
        preamble (a restore, a compaction) leaves the bot's tools and prompt cached.
        `cache=True` adds `cache_control` breakpoints (see `producers/prompt.py`)."""
        return prompt.request(self, system=system, tools=tools, cache=cache)


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
    `cache_control`. Blocks are shared, never mutated in place: a change replaces the
    block."""
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


def merge_turns(messages: Iterable[StoredMessage]) -> list[Turn]:
    """Consecutive same-role messages become one turn; blank text blocks are dropped."""
    turns: list[Turn] = []
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


def _normalise(turns: list[Turn]) -> list[Turn]:
    """Drop empty turns, re-merge neighbours of one role, start with a user turn."""
    out: list[Turn] = []
    for t in turns:
        if not t.blocks:
            continue
        if out and out[-1].role == t.role:
            out[-1].blocks += t.blocks
            out[-1].tokens += t.tokens
        else:
            out.append(t)
    while out and out[0].role != "user":
        out.pop(0)
    return out


def repair(turns: list[Turn]) -> list[Turn]:
    """Apply the pairing and alternation rules until nothing changes."""
    if not any(b.get("type") != "text" for t in turns for b in t.blocks):
        turns = _normalise(turns)  # no tool blocks: only alternation and the first turn
    else:
        while True:
            before = [(t.role, len(t.blocks)) for t in turns]
            turns = _normalise(_thinking(_pair_tools(turns)))
            if [(t.role, len(t.blocks)) for t in turns] == before:
                break
        turns = _normalise(_strip_finished(turns))
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


def _thinking(turns: list[Turn]) -> list[Turn]:
    """Thinking first in the current cycle's assistant turns, and never alone."""
    last_clean = _last_clean(turns)
    for i, turn in enumerate(turns):
        if turn.role != "assistant" or not any(b.get("type") in THINKING for b in turn.blocks):
            continue
        kept = turn.blocks
        if i > last_clean and kept[0].get("type") not in THINKING:
            # Merged after other content: what came before the thinking goes.
            kept = kept[next(j for j, b in enumerate(kept) if b.get("type") in THINKING) :]
        if all(b.get("type") in THINKING for b in kept):
            kept = []  # thinking without the answer or tool use it preceded
        _replace(turn, kept)
    return turns


def _strip_finished(turns: list[Turn]) -> list[Turn]:
    """Thinking of finished cycles left out: the API ignores it. Run once the turns are
    otherwise settled (no turn holds thinking alone), so it never empties a turn."""
    last_clean = _last_clean(turns)
    for turn in turns[:last_clean]:
        if turn.role == "assistant" and any(b.get("type") in THINKING for b in turn.blocks):
            _replace(turn, [b for b in turn.blocks if b.get("type") not in THINKING])
    return turns


def _last_clean(turns: list[Turn]) -> int:
    return max((i for i, t in enumerate(turns) if _clean(t)), default=-1)


def _replace(turn: Turn, kept: list[Block]) -> None:
    if len(kept) != len(turn.blocks):
        turn.blocks = kept
        turn.tokens = estimate_tokens(kept) if kept else 0


def from_cycle_end(messages: Sequence[StoredMessage]) -> Sequence[StoredMessage]:
    """The messages from the first user message that answers no tool call: a window whose
    edge falls inside a tool-use cycle starts after that cycle, not in its middle."""
    first = (i for i, m in enumerate(messages) if clean_start(m.role, m.content))
    return _after(messages, next(first, len(messages)))


def _after(messages: Sequence[StoredMessage], i: int) -> Sequence[StoredMessage]:
    # Only stray results before it (no assistant turn of a cut cycle): repair drops them
    # and keeps any text they came with.
    if all(m.role == "user" for m in messages[:i]):
        return messages
    return messages[i:]


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


def step_of(budget: int) -> int:
    """How far the window's start moves when a trim is due: half the budget, so one
    trim leaves room for half a budget of new turns before the next one."""
    return max(1, budget // 2)


def trim_start(before: Sequence[int], total: int, budget: int, available: int) -> int:
    """Index of the first message the coarse trim keeps: the first whose `before` (tokens
    of the window ahead of it) reaches the smallest multiple of the step that leaves at
    most `available` tokens. A pure function of the stored window: consecutive reads
    agree, and the start moves only when the window grew by a whole step."""
    step = step_of(budget)
    cut = max(0, -(-(total - available) // step)) * step
    return next((i for i, b in enumerate(before) if b >= cut), len(before))


def coarse_trim(
    messages: list[StoredMessage], before: Sequence[int] | None, budget: int, available: int
) -> tuple[list[StoredMessage], bool]:
    """The window less the coarse trim's cut (see `trim_start`); the whole window when
    the cut would leave no exchange to start at (the newest one alone is too big):
    `fit_budget` then drops what it must, exchange by exchange."""
    if not messages:
        return messages, False
    if before is None:
        before, run = [], 0
        for m in messages:
            before.append(run)
            run += m.tokens
    total = before[-1] + messages[-1].tokens
    # With the preamble's tokens taken off the budget; failing that, the cut the window
    # query made (it does not know the preamble), so both paths agree.
    for room in (available, budget):
        i = trim_start(before, total, budget, room)
        if i == 0:
            return messages, False
        kept = messages[i:]
        if any(clean_start(m.role, m.content) for m in kept):
            return kept, True
    return messages, False


def fit_budget(turns: list[Turn], budget: int) -> tuple[list[Turn], bool]:
    """Drop the oldest whole exchanges until the estimate fits; the newest always stays."""
    total = sum(t.tokens for t in turns)
    if total <= budget:  # the common case: no exchanges to find
        return turns, False
    kept = units(turns)
    dropped = False
    while len(kept) > 1 and total > budget:
        total -= sum(t.tokens for t in kept.pop(0))
        dropped = True
    return [t for unit in kept for t in unit], dropped


def build_context(
    messages: Iterable[StoredMessage],
    *,
    budget: int,
    system: str | None = None,
    window_start: dt.datetime | None = None,
    compacted: bool = False,
    before: Sequence[int] | None = None,
) -> Context:
    """The valid, budget-fitted context of a window of messages (oldest first); the
    system text (preamble, summaries) counts against the budget too. `before`: each
    message's tokens of the window ahead of it, when `messages` is the tail of the
    window that the window query already cut (the same rule, `trim_start`)."""
    system_tokens = estimate_tokens(system) if system else 0
    available = budget - system_tokens
    window, truncated = coarse_trim(list(messages), before, budget, available)
    truncated = truncated or bool(before and before[0] > 0)  # the query cut it already
    turns = repair(merge_turns(from_cycle_end(window)))
    # Rarely still over (the newest exchange alone, estimates of merged blocks): drop
    # whole exchanges as before, exact but not cache-stable.
    turns, dropped = fit_budget(turns, available)
    if dropped:
        turns = repair(turns)
    truncated = truncated or dropped
    return Context(
        messages=[{"role": t.role, "content": t.blocks} for t in turns],
        system=system,
        token_estimate=system_tokens + sum(t.tokens for t in turns),
        truncated=truncated,
        window_start=window_start,
        first_seq=turns[0].first_seq if turns else None,
        compacted=compacted,
    )
