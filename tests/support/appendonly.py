"""The invariant a thread's contexts keep between two boundaries (docs/context.md): every
read returns the previous read's messages unchanged, with new ones only at the end.

Precisely, for two reads of one thread with no boundary between them: everything of the
earlier read up to its last assistant turn that a user turn follows is the start of the
later read, message for message; the user turn and the system messages after it (which a
request ends with) may gain blocks at their end (more user messages merged in, system
messages posted after them); and a final assistant turn (the request that produced it
has already been sent) may still complete (a tool call answered, a continuation merged).
That is what keeps every thinking block's prefix and the prompt cache's prefix whole.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def _blocks(m: Message) -> list[Any]:
    content = m["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def extends(earlier: list[Message], later: list[Message]) -> str:
    """Why `later` does not extend `earlier` ("" when it does)."""
    kept = list(earlier)
    if kept and kept[-1]["role"] == "assistant":
        kept.pop()  # a final assistant turn may still complete
    fixed = max((i for i, m in enumerate(kept) if m["role"] == "assistant"), default=-1) + 1
    if later[:fixed] != kept[:fixed]:
        at = next(i for i in range(fixed) if i >= len(later) or later[i] != kept[i])
        return f"message {at} changed: {kept[at]!r} -> {later[at] if at < len(later) else None!r}"
    for i in range(fixed, len(kept)):
        if i >= len(later):
            return f"message {i} is gone"
        old, new = kept[i], later[i]
        if old["role"] != new["role"] or _blocks(new)[: len(_blocks(old))] != _blocks(old):
            return f"message {i} changed other than at its end: {old!r} -> {new!r}"
    return ""
