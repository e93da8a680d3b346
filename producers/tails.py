"""What a reader remembers of each thread's last read, so the next one costs what changed.

The `window_messages` query takes two things from a reader's last read of a thread:

- the tail hint: the first row it returned (seq, event id, `before`: the tokens of the
  window ahead of it) and that read's window key. While the key holds, the query sums
  only from that row on, not the whole window;
- the known rows: the rows it returned, up to `known_seq`. While the hint holds, the
  query sends those back without their payload and the reader fills them in from here.

The query checks the hint against the window's definition and the event stored at its
seq, and ignores a stale one, so a hint is never wrong, only useless. Rows are kept as
the query sent them (content as JSON text) and decoded afresh for every read: a caller
that edits a context's blocks changes nothing here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

Row = tuple[Any, ...]  # window_messages: seq, occurred_at, tokens, role, content, before, wkey, id
Known = dict[int, Row]  # seq -> the row as the last read returned it

# A read without a tail hint: the whole window is summed and every payload sent.
NO_HINT: Final[dict[str, Any]] = {
    "hint_key": None,
    "hint_seq": None,
    "hint_id": None,
    "hint_before": None,
    "known_seq": None,
}
SEQ, TOKENS, BEFORE, WKEY, EVENT_ID = 0, 2, 5, 6, 7  # a known row has no event id


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
        first = rows[0]
        hint = {
            "hint_key": first[WKEY],
            "hint_seq": first[SEQ],
            "hint_id": first[EVENT_ID],
            "hint_before": first[BEFORE],
            "known_seq": rows[-1][SEQ],
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
    """The rows with the payload of known rows (sent without it) filled in; None if one
    is not known (cannot happen while the query honours `known_seq`; the caller then
    reads the whole window)."""
    out = []
    for r in rows:
        if r[EVENT_ID] is not None:
            out.append(r)
            continue
        had = known.get(r[SEQ])
        if had is None:
            return None
        out.append((r[0], had[1], r[2], had[3], had[4], r[5], r[6], had[7]))
    return out


def _key(params: dict[str, Any]) -> tuple[str, str, str]:
    return params["agent"], params["channel"], params["thread"]
