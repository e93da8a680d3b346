"""Turn a window of stored messages into a context the Anthropic Messages API accepts.

Pure functions of their inputs. The rules (DESIGN invariant 6): the first turn is a
user turn; roles alternate (consecutive same-role messages are merged); every
`tool_use` is answered by its `tool_result` in the next user turn; no `tool_result`
without its `tool_use`; cuts happen only at turn boundaries. Beyond that, what the API
refuses is also repaired: empty or blank text blocks, a tool id used twice, trailing
white space at the end of a final assistant turn.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Block = dict[str, Any]


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

    def to_anthropic(self) -> dict[str, Any]:
        """Keyword arguments for `client.messages.create(model=..., max_tokens=..., **ctx)`."""
        out: dict[str, Any] = {"messages": self.messages}
        if self.system:
            out["system"] = self.system
        return out


def estimate_tokens(content: str | Sequence[Block]) -> int:
    """A cheap token estimate: about four characters a token."""
    if isinstance(content, str):
        return max(1, len(content) // 4)
    total = 0
    for block in content:
        kind = block.get("type")
        if kind == "text":
            total += len(block.get("text", ""))
        elif kind == "tool_use":
            total += len(str(block.get("name", ""))) + len(str(block.get("input", "")))
        elif kind == "tool_result":
            inner = block.get("content", "")
            total += (
                len(inner) if isinstance(inner, str) else sum(len(b.get("text", "")) for b in inner)
            )
    return max(1, total // 4)


def _blank(text: object) -> bool:
    return not isinstance(text, str) or not text or text.isspace()


def _blocks(content: str | list[Block]) -> list[Block]:
    """Content as blocks, without blank text (the API refuses it). Blocks are shared,
    never mutated in place: a change replaces the block."""
    if isinstance(content, str):
        return [] if _blank(content) else [{"type": "text", "text": content}]
    return [b for b in content if b.get("type") != "text" or not _blank(b.get("text"))]


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
            turns = _normalise(_pair_tools(turns))
            if [(t.role, len(t.blocks)) for t in turns] == before:
                break
    if turns and turns[-1].role == "assistant":
        _strip_trailing_space(turns[-1])
        turns = _normalise(turns)
    return turns


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
        clean_start = t.role == "user" and not any(b.get("type") == "tool_result" for b in t.blocks)
        if clean_start or not out:
            out.append([t])
        else:
            out[-1].append(t)
    return out


def fit_budget(turns: list[Turn], budget: int) -> tuple[list[Turn], bool]:
    """Drop the oldest whole exchanges until the estimate fits; the newest always stays."""
    kept = units(turns)
    total = sum(t.tokens for t in turns)
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
) -> Context:
    """The valid, budget-fitted context of a window of messages (oldest first); the
    system text (preamble, summaries) counts against the budget too."""
    system_tokens = estimate_tokens(system) if system else 0
    turns = repair(merge_turns(messages))
    turns, truncated = fit_budget(turns, budget - system_tokens)
    if truncated:
        turns = repair(turns)
    return Context(
        messages=[{"role": t.role, "content": t.blocks} for t in turns],
        system=system,
        token_estimate=system_tokens + sum(t.tokens for t in turns),
        truncated=truncated,
        window_start=window_start,
        first_seq=turns[0].first_seq if turns else None,
    )
