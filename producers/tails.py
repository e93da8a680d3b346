"""What a reader remembers of each thread's last read, so the next one costs what changed.

The `window_tail` query takes the tail hint of a reader's last read of a thread: the
last row it returned (seq, event id, `before`: the tokens of the window ahead of it) and
that read's window key. While the key holds, the query reads only from that row on: the
hint's row comes back without its payload, the new rows with theirs, and every row says
where the budget's cut is now (`at`). The rows ahead of the hint that the cut keeps are
the last read's: the reader keeps them here (`fill`). A read costs what changed.

The query checks the hint against the window's definition and the event stored at its
seq, and returns nothing for a stale one (the reader then reads the window with
`window_messages`), so a hint is never wrong, only useless. Rows are kept as
the query sent them (content as JSON text) and decoded afresh for every read: a caller
that edits a context's blocks changes nothing here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

# window_messages, window_tail: seq, occurred_at, tokens, role, content, before, wkey, event id, at
Row = tuple[Any, ...]
Known = dict[int, Row]  # seq -> the row as the last read returned it, in seq order

# A read without a tail hint: the window's sums taken afresh (from the running totals, or
# summing the window) and every payload sent.
NO_HINT: Final[dict[str, Any]] = {
    "hint_key": None,
    "hint_seq": None,
    "hint_id": None,
    "hint_before": None,
}
SEQ, TOKENS, BEFORE, WKEY, EVENT_ID, AT = 0, 2, 5, 6, 7, 8  # a bare row has no event id


@dataclass(frozen=True)
class Tail:
    """One thread's last read: the hint parameters and the rows it returned."""

    hint: dict[str, Any]
    rows: Known
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

    def hint(self, params: dict[str, Any]) -> tuple[dict[str, Any], Known]:
        """`params` with the thread's hint and known rows, if any, and those rows."""
        with self._lock:
            got = self._last.get(_key(params))
        if got is None:
            return params, {}
        return {**params, **got.hint}, got.rows

    def learn(self, params: dict[str, Any], rows: Sequence[Row]) -> None:
        """Remember what a read returned (complete rows, as `fill` gives them)."""
        if not rows:
            return
        last = rows[-1]
        hint = {
            "hint_key": last[WKEY],
            "hint_seq": last[SEQ],
            "hint_id": last[EVENT_ID],
            "hint_before": last[BEFORE],
        }
        tail = Tail(hint, {r[SEQ]: r for r in rows}, sum(r[TOKENS] for r in rows))
        key = _key(params)
        with self._lock:
            old = self._last.pop(key, None)
            self._held += tail.tokens - (old.tokens if old else 0)
            self._last[key] = tail
            while self._last and (len(self._last) > self.size or self._held > self.tokens):
                self._held -= self._last.popitem(last=False)[1].tokens

    def __len__(self) -> int:
        return len(self._last)


def fill(rows: Sequence[Row], known: Known) -> list[Row] | None:
    """The kept rows in full. A hinted read starts with the hint's row, bare: it and the
    known rows ahead of it that the cut keeps come from `known`. None if that row is
    not known (cannot happen while the hint and `known` come from one read; the caller
    then reads the whole window)."""
    if not rows or rows[0][EVENT_ID] is not None:
        return list(rows)  # no hint, or the cut passed every known row
    first = rows[0]
    had = known.get(first[SEQ])
    if had is None:
        return None
    ahead = [r for r in known.values() if r[SEQ] < first[SEQ] and r[BEFORE] >= first[AT]]
    return [*ahead, had, *rows[1:]]


def _key(params: dict[str, Any]) -> tuple[str, str, str]:
    return params["agent"], params["channel"], params["thread"]
