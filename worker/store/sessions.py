"""Pure rules of saved sessions: ids, slugs, previews, and where a compaction cuts."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import unicodedata
from collections.abc import Collection, Sequence
from typing import Any

from contextlog.producers.context import StoredMessage, merge_turns, repair, units

MAX_SLUG = 40
PREVIEW_CHARS = 80
HASH_CHARS = 6
LAST = "last"
# Compact when a window passes this share of its token budget: the one home of the rule
# (`over_threshold` here, and the queries `advance_threads` and `threads_to_compact`).
COMPACT_AT = 0.75

_NOT_SLUG = re.compile(r"[^a-z0-9-]+")
_HYPHENS = re.compile(r"-{2,}")
_SPACE = re.compile(r"\s+")
# What a session id looks like, for ids that come from outside (an imported file).
SESSION_ID = re.compile(r"^\d{4}-\d{2}-\d{2}_[a-z0-9][a-z0-9-]{0,39}(-\d+)?$")


def text_of(content: str | Sequence[Any]) -> str:
    """The readable text of a message's content (text blocks and tool results)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            inner = block.get("content", "")
            parts.append(inner if isinstance(inner, str) else text_of(inner))
        elif block.get("type") == "tool_use":
            parts.append(f"[{block.get('name', 'tool')}]")
    return " ".join(p for p in parts if p)


def slug(description: str | None) -> str:
    """Lowercase, white space to hyphens, only [a-z0-9-], at most 40 characters ('' if none)."""
    if not description:
        return ""
    ascii_text = unicodedata.normalize("NFKD", description).encode("ascii", "ignore").decode()
    text = _SPACE.sub("-", ascii_text.lower())
    text = _HYPHENS.sub("-", _NOT_SLUG.sub("", text)).strip("-")
    return text[:MAX_SLUG].rstrip("-")


def content_hash(first_message: str) -> str:
    """Six hex characters naming a session saved without a description."""
    return hashlib.sha256(first_message.encode()).hexdigest()[:HASH_CHARS]


def session_id(
    created_at: dt.datetime, description: str | None, first_message: str, taken: Collection[str]
) -> str:
    """`YYYY-MM-DD_<slug>`; a collision within the conversation gets -2, -3, ..."""
    day = created_at.astimezone(dt.UTC).strftime("%Y-%m-%d")
    base = f"{day}_{slug(description) or content_hash(first_message)}"
    return unique(base, taken)


def unique(base: str, taken: Collection[str]) -> str:
    """`base`, or the first of `base-2`, `base-3`, ... not in `taken`."""
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def preview(first_message: str) -> str:
    """The first message on one line, at most 80 characters."""
    line = _SPACE.sub(" ", first_message).strip()
    return line if len(line) <= PREVIEW_CHARS else line[: PREVIEW_CHARS - 1] + "…"


def over_threshold(window_tokens: int, budget: int) -> bool:
    """Whether a window is large enough to compact."""
    return window_tokens > COMPACT_AT * budget


def compaction_cut(messages: Sequence[StoredMessage]) -> int | None:
    """The seq through which the oldest half of a window (whole exchanges) is summarised.

    Exchanges start at a user turn that answers no tool call, so what is left after
    the cut starts cleanly. None when the window is a single exchange.
    """
    exchanges = units(repair(merge_turns(messages)))
    if len(exchanges) < 2:
        return None
    total = sum(t.tokens for unit in exchanges for t in unit)
    done = 0
    for i, unit in enumerate(exchanges[:-1]):
        done += sum(t.tokens for t in unit)
        if done * 2 >= total or i == len(exchanges) - 2:
            return exchanges[i + 1][0].first_seq - 1
    return None  # pragma: no cover - the loop always returns
