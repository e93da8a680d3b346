"""What a reader remembers of each thread's last read, so the next one costs what changed.

A thread's context only grows at its end between two boundaries (docs/context.md), so a
reader that read it once needs only what was logged since: `segment_messages` takes the
boundary count of the reader's last read and the log position it read up to, and
answers with the segment's state and the rows after that position, or with nothing at
all once the thread crossed a boundary (the reader then reads the segment afresh). Rows
are kept as the query sent them (content as JSON text) and decoded afresh for every
read: a caller that edits a context's blocks changes nothing here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

# segment_messages: seq, tokens, role, content (JSON text), event id; the first row (seq
# -1) carries the segment's state as JSON in its content.
Row = tuple[Any, ...]
SEQ, TOKENS, CONTENT = 0, 1, 3
STATE_SEQ: Final = -1
# A read without a hint: the whole segment.
NO_HINT: Final[dict[str, Any]] = {"boundaries": None, "from_seq": 0, "last_id": None}


@dataclass(frozen=True)
class Tail:
    """One thread's last read: its boundary count, where it read up to, and its rows."""

    boundaries: int
    last_seq: int
    last_id: str | None  # the event at last_seq: the read is of this log
    rows: tuple[Row, ...]
    tokens: int


class Tails:
    """Each thread's last read, least recently read forgotten first: past `size` threads,
    or past `tokens` tokens of kept rows (the rows' text is what takes the memory)."""

    def __init__(self, size: int = 10_000, tokens: int = 4_000_000) -> None:
        self.size = size
        self.tokens = tokens
        self._last: OrderedDict[tuple[str, str, str], Tail] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def hint(self, params: dict[str, Any]) -> tuple[dict[str, Any], Tail | None]:
        """`params` for a read from the thread's last one (if any), and that read."""
        with self._lock:
            got = self._last.get(_key(params))
        if got is None:
            return {**params, **NO_HINT}, None
        hint = {"boundaries": got.boundaries, "from_seq": got.last_seq + 1, "last_id": got.last_id}
        return {**params, **hint}, got

    def learn(self, params: dict[str, Any], state: dict[str, Any], rows: list[Row]) -> None:
        """Remember a read: the segment's `state` and all its rows."""
        tail = Tail(
            int(state["boundaries"]),
            int(state["last_seq"]),
            state.get("last_id"),
            tuple(rows),
            sum(r[TOKENS] for r in rows),
        )
        key = _key(params)
        with self._lock:
            old = self._last.pop(key, None)
            self._held += tail.tokens - (old.tokens if old else 0)
            self._last[key] = tail
            while self._last and (len(self._last) > self.size or self._held > self.tokens):
                self._held -= self._last.popitem(last=False)[1].tokens

    def __len__(self) -> int:
        return len(self._last)


def _key(params: dict[str, Any]) -> tuple[str, str, str]:
    return params["agent"], params["channel"], params["thread"]
