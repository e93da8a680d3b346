"""The request an adapter sends: its own tools and system prompt, our header, the
context's messages, and (opt-in) prompt-cache breakpoints.

The API caches the prefix tools -> system -> messages up to a block marked with
`cache_control` (at most four per request; a prefix under the model's minimum, 512 to
4,096 tokens by model, is simply not cached). The context only grows at its end between
boundaries (docs/context.md), so this prefix changes rarely; the breakpoints placed
here let the API reuse it:

1. the newest message's last block: the whole request is written to the cache, and the
   next request (the same messages plus new ones) reads it;
2. the end of the bot's own system prompt (or tools): stable for the bot's lifetime,
   it survives a new header or a boundary's cut of the messages;
3. the last message before the newest assistant turn: where the previous request (the
   one that answer came from) ended and wrote its cache entry, so the hit does not
   depend on the API's 20-block look-back from breakpoint 1;
4. our header: a restored session's or our compaction's summary, stable between
   boundaries.

Breakpoints the adapter set itself on its tools or system count against the four; ours
fill what is left, in that order of priority. A block that cannot carry one (thinking,
redacted thinking, empty text) is skipped for the nearest earlier one that can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from contextlog.schema.blocks import THINKING

Block = dict[str, Any]
MAX_BREAKPOINTS: Final = 4
EPHEMERAL: Final = {"type": "ephemeral"}


def request(
    context: Sequence[dict[str, Any]],
    header: str | None,
    *,
    system: str | Sequence[Block] | None,
    tools: Sequence[Block] | None,
    cache: bool,
) -> dict[str, Any]:
    """Keyword arguments in cache order: tools, system (the bot's, then our `header`),
    messages (the `context`'s; copies where marked: the context and the adapter's objects
    are never changed)."""
    own = _as_blocks(system)
    blocks = own + ([{"type": "text", "text": header}] if header else [])
    tool_list = [dict(t) for t in tools] if tools else []
    messages = list(context)
    if cache:
        _mark(tool_list, own, blocks, messages)
    out: dict[str, Any] = {}
    if tool_list:
        out["tools"] = tool_list
    if blocks:
        out["system"] = _plain(blocks) if not cache and not isinstance(system, list) else blocks
    out["messages"] = messages
    return out


def _plain(blocks: list[Block]) -> str | list[Block]:
    """One text block as a plain string (as before this module existed), else blocks."""
    return str(blocks[0]["text"]) if len(blocks) == 1 else blocks


def _as_blocks(system: str | Sequence[Block] | None) -> list[Block]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"type": "text", "text": system}]
    return [dict(b) for b in system]


def _count(blocks: Sequence[Block]) -> int:
    return sum("cache_control" in b for b in blocks)


def _mark(
    tools: list[Block], own: list[Block], system: list[Block], messages: list[dict[str, Any]]
) -> None:
    """Place breakpoints in priority order until four are used (the adapter's count)."""
    left = MAX_BREAKPOINTS - _count(tools) - _count(system)
    answers = [i for i, m in enumerate(messages[:-1]) if m["role"] == "assistant"]
    wanted: list[tuple[str, int]] = []
    if messages:
        wanted.append(("message", len(messages) - 1))
    if own:
        wanted.append(("system", len(own) - 1))
    elif tools:
        wanted.append(("tool", len(tools) - 1))
    if answers and answers[-1] > 0:
        wanted.append(("message", answers[-1] - 1))
    if len(system) > len(own):
        wanted.append(("system", len(system) - 1))
    for where, i in wanted:
        if left <= 0:
            return
        if where == "tool":
            placed = _set(tools, i)
        elif where == "system":
            placed = _set(system, i)
        else:
            placed = _mark_message(messages, i)
        left -= placed


def _set(blocks: list[Block], i: int) -> int:
    if "cache_control" in blocks[i]:
        return 0
    blocks[i] = {**blocks[i], "cache_control": EPHEMERAL}
    return 1


def _mark_message(messages: list[dict[str, Any]], i: int) -> int:
    """Mark the last block of message i that may carry a breakpoint."""
    content = messages[i]["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    for j in range(len(blocks) - 1, -1, -1):
        b = blocks[j]
        if b.get("type") in THINKING or (b.get("type") == "text" and not b.get("text")):
            continue
        placed = _set(blocks, j)
        messages[i] = {**messages[i], "content": blocks}
        return placed
    return 0
