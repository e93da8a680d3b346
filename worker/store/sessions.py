"""Pure rules of saved sessions: ids, slugs, previews, and what a restore brings back."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import unicodedata
from collections.abc import Collection, Sequence
from typing import Any

from contextlog.producers.context import StoredMessage, clean_start

MAX_SLUG = 40
PREVIEW_CHARS = 80
HASH_CHARS = 6
LAST = "last"

_NOT_SLUG = re.compile(r"[^a-z0-9-]+")
_HYPHENS = re.compile(r"-{2,}")
_SPACE = re.compile(r"\s+")
# What a session id looks like, for ids that come from outside (an imported file).
SESSION_ID = re.compile(r"^\d{4}-\d{2}-\d{2}_[a-z0-9][a-z0-9-]{0,39}(-\d+)?$")


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


def restore_note(
    session_id: str, saved: dt.datetime | None, summary: str | None, imported: bool = False
) -> str:
    """The header of a restored session's segments: what was resumed, and its summary
    (frozen with the segment: a summary that lands later is appended as a note). An
    imported session's summary came with its file, not from this deployment's worker,
    and says so."""
    when = f" (saved {saved:%Y-%m-%d %H:%M UTC})" if saved else ""
    said = summary or "(its summary is still being written)"
    if imported:
        return (
            f"Resumed imported session {session_id}{when}. Its summary, as the imported"
            f" file gives it: {said}"
        )
    return f"Resumed saved session {session_id}{when}. Its summary: {said}"


def fit_restored(messages: Sequence[StoredMessage], room: int) -> list[StoredMessage]:
    """The newest exchanges of a restored thread that fit in `room` tokens: the longest
    tail that starts at an opening user message; the newest exchange alone when none
    fits; all of them when none opens an exchange (the context starts at its first)."""
    starts = {i for i, m in enumerate(messages) if clean_start(m.role, m.content)}
    if not starts:
        return list(messages)
    kept = list(messages[: _closed(messages, max(starts))])
    best, total = max(starts), 0
    for i in range(len(kept) - 1, -1, -1):
        total += kept[i].tokens
        if total > room:
            break
        if i in starts:
            best = i
    return kept[best:]


def _closed(messages: Sequence[StoredMessage], last_start: int) -> int:
    """Where a restored thread ends: after the whole session, unless it ends inside a
    tool-use cycle (a call waiting for its result, or results waiting for the answer);
    then right after the message that opened that cycle. A cycle continued after the
    restore would need the thinking it began with, which a restore removes."""
    tail = [m for m in messages[last_start + 1 :] if m.role != "system"]
    if not tail:
        return len(messages)
    last = tail[-1]
    calls = last.role == "assistant" and _has(last.content, "tool_use")
    answers = last.role == "user" and _has(last.content, "tool_result")
    return last_start + 1 if calls or answers else len(messages)


def _has(content: Any, kind: str) -> bool:
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == kind for b in content
    )
