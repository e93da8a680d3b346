"""Per-conversation projections, folded from events: one fold for live ingest and rebuild.

A batch of events (in log order) folds into one change per conversation and one per
thread; `apply` writes them with two statements. Live ingest folds each batch inside
its append transaction; `contextlog rebuild` folds the whole log, chunk by chunk, with
the same code, which is why the two give identical results.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import msgspec
import psycopg
from psycopg.rows import TupleRow

from contextlog.producers.context import COMPACT_AT, CUT_AT, EDGE_STEP
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import query

MESSAGE = "message.v1"
CLEAR = "clear.v1"
CONFIGURE = "configure.v1"
SETTINGS = ("rolling_window", "idle_timeout", "token_budget")


class Row(NamedTuple):
    """What the projections need of one event (a tuple: made once per event on ingest)."""

    agent: str
    channel: str
    thread: str
    kind: str
    at: dt.datetime  # its authoritative time: ingest's clock (never a producer's)
    settings: dict[str, int] | None = None  # the fields a configure event sets
    tokens: int = 0  # a message's token estimate
    source: str | None = None  # the adapter a message came from
    # Where a boundary may fall (`events.mark`, 014): OPENS, COMPACTS, or 0.
    mark: int = 0


OPENS = 1  # a user message that answers no tool call: an exchange starts here
COMPACTS = 2  # an assistant message holding the API's compaction block


@dataclass
class ConversationChange:
    """A batch's effect on one conversation; offsets count its events in the batch, from 1."""

    count: int = 0
    message_offset: int = 0  # the batch's last message of this conversation
    source: str | None = None
    cleared_offset: int = 0
    cleared_at: dt.datetime | None = None
    settings: dict[str, int] = field(default_factory=dict)
    last_activity_at: dt.datetime | None = None
    at: dt.datetime | None = None  # the latest time of its events in the batch


@dataclass
class ThreadChange:
    """A batch's effect on one thread of a conversation."""

    messages: int = 0
    tokens: int = 0
    last_activity_at: dt.datetime | None = None
    marks: int = 0  # messages where a boundary may fall


Conv = tuple[str, str]
ThreadKey = tuple[str, str, str]


def _later(a: dt.datetime | None, b: dt.datetime) -> dt.datetime:
    return b if a is None or b > a else a


def fold(
    rows: Iterable[Row],
) -> tuple[dict[Conv, ConversationChange], dict[ThreadKey, ThreadChange]]:
    """Fold events in log order into conversation and thread changes."""
    convs: dict[Conv, ConversationChange] = {}
    threads: dict[ThreadKey, ThreadChange] = {}
    for r in rows:
        c = convs.setdefault((r.agent, r.channel), ConversationChange())
        c.count += 1
        c.at = _later(c.at, r.at)
        if r.kind == MESSAGE:
            c.message_offset = c.count
            c.source = r.source or c.source
            c.last_activity_at = _later(c.last_activity_at, r.at)
            t = threads.setdefault((r.agent, r.channel, r.thread), ThreadChange())
            t.messages += 1
            t.tokens += r.tokens
            t.last_activity_at = _later(t.last_activity_at, r.at)
            t.marks += r.mark != 0
        elif r.kind == CLEAR:
            c.cleared_offset, c.cleared_at = c.count, r.at
        elif r.kind == CONFIGURE and r.settings:
            c.settings.update(r.settings)
    return convs, threads


def settings_of(payload: dict[str, Any]) -> dict[str, int]:
    """The settings a configure event's payload sets (absent fields keep their value)."""
    return {k: int(payload[k]) for k in SETTINGS if payload.get(k) is not None}


class Applied(NamedTuple):
    """What writing a batch's changes tells ingest."""

    bases: dict[Conv, int]  # each conversation's last seq before the batch
    to_compact: list[Conv]  # conversations with a thread past the compaction threshold
    # Conversations with new messages: (key, idle timeout or None for the default,
    # last activity), what the idle timer needs.
    active: list[tuple[Conv, int | None, dt.datetime]]
    # Each thread's running token total and latest message time before the batch (0 and
    # None for a new thread): where its messages' `through` and `late` go on from.
    totals: dict[ThreadKey, tuple[int, dt.datetime | None]]
    # Each conversation's recorded time of the batch (`events.recorded_at`): the batch's
    # time, never earlier than the conversation's last.
    times: dict[Conv, dt.datetime]


def apply(
    cur: psycopg.Cursor[TupleRow],
    convs: dict[Conv, ConversationChange],
    threads: dict[ThreadKey, ThreadChange],
    defaults: ConversationDefaults,
) -> Applied:
    """Write the changes (sequence numbers reserved, running totals advanced).
    Conversations, then threads, each in sorted order: a fixed lock order, so two
    writers cannot deadlock. The boundary decisions read the batch's rows back, so they
    run once those are written: `segments`."""
    params = change_params(convs, threads, defaults)
    conversations = cur.execute(query("advance_conversations"), params).fetchall()
    thread_answers: list[Any] = []
    if threads:
        thread_answers = cur.execute(query("advance_threads"), params).fetchall()
    return answered(convs, conversations, thread_answers)


def segments(
    cur: psycopg.Cursor[TupleRow],
    convs: dict[Conv, ConversationChange],
    threads: dict[ThreadKey, ThreadChange],
    defaults: ConversationDefaults,
) -> list[Conv]:
    """The threads' boundary decisions for the batch's rows (written by now); returns the
    conversations with a segment to compact."""
    if not threads:
        return []
    params = change_params(convs, threads, defaults)
    rows = cur.execute(query("advance_segments"), params).fetchall()
    return sorted({(agent, channel) for agent, channel, _thread, compact in rows if compact})


def change_params(
    convs: dict[Conv, ConversationChange],
    threads: dict[ThreadKey, ThreadChange],
    defaults: ConversationDefaults,
) -> dict[str, Any]:
    """The parameters of the statements that write the changes: `advance_conversations`
    and `advance_threads` here, `append_messages` with the rows too."""
    return {
        "conversations": _conversation_rows(convs),
        "thread_rows": _thread_rows(threads, convs),
        "default_budget": defaults.token_budget,
        "default_window": defaults.rolling_window,
        "compact_at": COMPACT_AT,
        "cut_at": CUT_AT,
        "edge_step": EDGE_STEP,
    }


def answered(
    convs: dict[Conv, ConversationChange],
    conversation_answers: Iterable[Sequence[Any]],
    thread_answers: Iterable[Sequence[Any]],
) -> Applied:
    """What writing the changes tells ingest, from the rows `advance_conversations`
    (agent, channel, last_seq, idle_timeout, last_activity_at, recorded_at) and
    `advance_threads` (agent, channel, thread, tokens_through, last_activity_at, and
    `compact` in `append_messages`' answer) answered. Unpacked, not `class_row`: this
    runs for every ingest batch."""
    to_compact: set[Conv] = set()
    totals: dict[ThreadKey, tuple[int, dt.datetime | None]] = {}
    for agent, channel, thread, through, latest, *compact in thread_answers:
        totals[(agent, channel, thread)] = (through or 0, latest)
        if compact and compact[0]:
            to_compact.add((agent, channel))
    bases: dict[Conv, int] = {}
    times: dict[Conv, dt.datetime] = {}
    active: list[tuple[Conv, int | None, dt.datetime]] = []
    for agent, channel, last_seq, idle_timeout, last_activity_at, at in conversation_answers:
        key = (agent, channel)
        change = convs[key]
        bases[key] = int(last_seq) - change.count
        times[key] = at
        # A conversation with new messages, or whose idle timeout changed, (re)arms its
        # timer: `/context settings idle=5s` takes effect now, not at the next message.
        if last_activity_at is not None and _rearms(change):
            active.append((key, idle_timeout, last_activity_at))
    return Applied(bases, sorted(to_compact), active, totals, times)


def _rearms(change: ConversationChange) -> bool:
    return bool(change.message_offset) or "idle_timeout" in change.settings


def _conversation_rows(convs: dict[Conv, ConversationChange]) -> str:
    """The conversations' changes as `advance_conversations` takes them (sorted: the
    lock order)."""
    return msgspec.json.encode(
        [
            {
                "agent": k[0],
                "channel": k[1],
                "n": c.count,
                "cleared": c.cleared_offset,
                "cleared_at": c.cleared_at,
                "activity": c.last_activity_at,
                "message": c.message_offset,
                "source": c.source,
                "at": c.at,
                **c.settings,
            }
            for k in sorted(convs)
            for c in (convs[k],)
        ]
    ).decode()


def _thread_rows(
    threads: dict[ThreadKey, ThreadChange], convs: dict[Conv, ConversationChange]
) -> str:
    """The threads' changes as `advance_threads` takes them (sorted: the lock order);
    `conv_n`, their conversation's events in the batch, places the batch in its log."""
    return msgspec.json.encode(
        [
            {
                "agent": k[0],
                "channel": k[1],
                "thread": k[2],
                "n": t.messages,
                "tokens": t.tokens,
                "activity": t.last_activity_at,
                "marks": t.marks,
                "conv_n": convs[(k[0], k[1])].count,
            }
            for k in sorted(threads)
            for t in (threads[k],)
        ]
    ).decode()


T = TypeVar("T")
K = TypeVar("K")


def rounds(
    items: Sequence[T],
    key: Callable[[T], K],
    is_command: Callable[[T], bool],
    starts: Callable[[T], bool] = lambda _: False,
    barrier: Callable[[T], bool] = lambda _: False,
) -> Iterator[list[T]]:
    """Split a batch so each command's handler sees its conversation's projections as of
    itself: round k holds each conversation's events up to and including its k-th
    command. An event that `starts` a round (a setting: it is folded in at the start of
    its round, so it must not reach the events before it) begins a new one. Only a
    conversation's own order matters (sequence numbers are per conversation), so a batch
    needs as many rounds as its busiest conversation has commands, usually one. A
    `barrier` (a command that reaches other conversations: an erase) is a round alone,
    after every event before it in the batch and before every event after it, so its log
    position, and what it sees, are the same live and in a replay."""
    part: list[T] = []
    for item in items:
        if barrier(item):
            yield from _rounds(part, key, is_command, starts)
            part = []
            yield [item]
        else:
            part.append(item)
    yield from _rounds(part, key, is_command, starts)


def _rounds(
    items: Sequence[T],
    key: Callable[[T], K],
    is_command: Callable[[T], bool],
    starts: Callable[[T], bool],
) -> Iterator[list[T]]:
    per_conv: dict[K, list[list[T]]] = {}
    for item in items:
        parts = per_conv.setdefault(key(item), [[]])
        if parts[-1] and starts(item):
            parts.append([])
        parts[-1].append(item)
        if is_command(item):
            parts.append([])
    for k in range(max((len(p) for p in per_conv.values()), default=0)):
        batch = [item for parts in per_conv.values() if k < len(parts) for item in parts[k]]
        if batch:
            yield batch
