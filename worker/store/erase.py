"""`erase.v1`, applied by ingest in the batch's transaction, in its shard's log order
(issue 34.3; the contract and why redaction in place: schema/erasure.py).

An erase names its subject by hash: a conversation (its channel), a sender across the
agent's conversations, or a session's messages. Each shard's event erases in that shard's
conversations only (which only that shard's ingest writes), everything logged before it:

- a conversation: dropped whole, as retention drops one (events, projections, search
  rows, notes, attachment references and the attachments nothing else references); its
  seqs start afresh if it is written to again, as after `retire`;
- a sender: every event naming them, and the messages of the exchanges they opened (the
  assistant's answers and tool calls, tool results, system messages, up to the next
  opening user message), redacted in place; a session: its messages, the command that
  made it and its summaries, redacted, and the session removed.

Then what was derived from the redacted events is made again from what is left, by rules
that read only the log as it is now, so `contextlog rebuild` (which replays the redacted
log and this event) gives the same state: their search rows and attachment references go
(and attachments nothing references); sessions holding them get their description and
preview again and a new summary (a new round); summaries and compactions in the log that
drew on them become same-length filler; every touched thread crosses an `erase` boundary,
its summary or the API's compaction block replaced when it covered an erased message,
and the text of touched sessions taken out of its header and notes. The effects: jobs for
the new summaries, a scrub of Redis (`effects.scrub`: the inbound and dead-letter
streams, notifications, attachment bytes, job records), and `erase_done` for the sender.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import msgspec

from contextlog.schema import blocks, erasure
from contextlog.schema import events as ev
from contextlog.schema import notices as nt
from contextlog.schema.defaults import ConversationDefaults
from contextlog.schema.queries import query
from contextlog.worker.effects.kinds import Effect, Scrub, Summarize
from contextlog.worker.store import policy, retention, sessions
from contextlog.worker.store.replies import Cursor, notice, rows_as

ERASED_WHY: Final = "some of what it summarised was erased"
Key = tuple[str, str]


@dataclass
class Targets:
    """What an erase reaches in one shard: conversations to drop whole, and the events to
    redact by conversation (seq, event id, payload)."""

    before: int  # the erase's position: what was logged before it
    at: dt.datetime  # the erase's recorded time
    drop: list[str] = field(default_factory=list)
    redact: dict[str, list[tuple[int, str, dict[str, Any]]]] = field(default_factory=dict)
    session: tuple[str, str] | None = None  # (channel, session id) of a session erase

    def events(self) -> int:
        """How many events it redacts (a dropped conversation's are counted apart)."""
        return sum(len(v) for v in self.redact.values())


class Retaken(NamedTuple):
    """A row of `retake_session`: the session's new summary round, and whether it is live."""

    summary_round: int
    live: bool


@dataclass
class Done:
    """What an erase did (for its notice, the metrics and a dry run)."""

    conversations: list[str] = field(default_factory=list)  # dropped
    events: int = 0  # redacted or dropped
    sessions: list[tuple[str, str]] = field(default_factory=list)  # (channel, id) touched
    attachments: int = 0  # deleted
    touched: list[str] = field(default_factory=list)  # conversations with redactions
    event_ids: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)  # attachments no longer referenced
    summaries: list[Summarize] = field(default_factory=list)


def mine(agent: str, channel: str, e: ev.EraseRequested) -> bool:
    """Whether a conversation is on the erase event's shard."""
    return erasure.shard_of(agent, channel, e.shards) == e.shard


def targets(cur: Cursor, e: ev.EraseRequested, before: int, at: dt.datetime) -> Targets:
    """What the erase reaches, logged before position `before` (read only)."""
    found = Targets(before, at)
    channels = [
        c
        for (c,) in cur.execute(query("erase_conversations"), {"agent": e.agent})
        if mine(e.agent, c, e)
    ]
    if e.scope == "sender":
        params = {"agent": e.agent, "channels": channels, "before": before, "subject": e.subject}
        for channel, seq, event_id, payload in cur.execute(query("erase_sender_events"), params):
            found.redact.setdefault(channel, []).append((seq, str(event_id), payload))
        return found
    named = [c for c in channels if erasure.subject_hash(e.agent, "channel", c) == e.subject]
    if e.scope == "conversation":
        found.drop = named
        return found
    for channel in named:
        key = {"agent": e.agent, "channel": channel}
        for (sid,) in cur.execute(query("conversation_sessions"), key):
            if erasure.subject_hash(e.agent, "session", sid) == e.session:
                found.session = (channel, sid)
                params = {**key, "session_id": sid, "before": before}
                rows = cur.execute(query("erase_session_events"), params).fetchall()
                found.redact[channel] = [(s, str(i), p) for _, s, i, p in rows]
    return found


def on_erase(
    cur: Cursor, e: ev.EraseRequested, seq: int, at: dt.datetime, d: ConversationDefaults
) -> list[Effect]:
    """Apply an erase (see the module doc); returns its jobs, its scrub and its notice."""
    (before,) = cur.execute(
        query("erase_position"), {"agent": e.agent, "channel": e.channel, "seq": seq}
    ).fetchone() or (0,)
    found = targets(cur, e, int(before), at)
    done = apply(cur, e, found)
    effects: list[Effect] = list(done.summaries)
    if done.conversations or done.touched or done.event_ids:
        effects.append(scrub_effect(e, done))
    text = (
        f"erase {e.erase_id} (shard {e.shard} of {e.shards}): {done.events} events, "
        f"{len(done.conversations)} conversations dropped, {len(done.sessions)} sessions "
        f"touched, {done.attachments} attachments deleted"
    )
    return effects + notice(e, nt.ERASE_DONE, text)


def apply(cur: Cursor, e: ev.EraseRequested, found: Targets) -> Done:
    """Drop, redact, then make again what was derived from what was redacted."""
    done = Done()
    erase_id = str(e.erase_id)
    for channel in found.drop:
        _drop(cur, e.agent, channel, found, done)
    for channel, rows in found.redact.items():
        _redact(cur, e.agent, channel, rows, erase_id)
    # From the marks, not from `found`: a replay of the log, where these events were
    # redacted long ago, finds nothing to redact and must still derive the same.
    channels = sorted(set(found.redact) | set(_marked(cur, e, found)))
    for channel in channels:
        _settle(cur, e, channel, found, done)
    return done


def _marked(cur: Cursor, e: ev.EraseRequested, found: Targets) -> list[str]:
    """Conversations of this shard holding events this erase marked: where a replay finds
    them (live ingest knows them from `found`)."""
    if found.redact or found.drop:
        return []
    params = {"agent": e.agent, "erase_id": str(e.erase_id), "before": found.before}
    rows = cur.execute(query("erase_marked_conversations"), params)
    return [c for (c,) in rows if mine(e.agent, c, e)]


def _drop(cur: Cursor, agent: str, channel: str, found: Targets, done: Done) -> None:
    key = {"agent": agent, "channel": channel, "before": found.before}
    ids = [str(i) for (i,) in cur.execute(query("conversation_event_ids"), key)]
    sids = [s for (s,) in cur.execute(query("conversation_sessions"), key)]
    (events, hashes) = cur.execute(query("retire_delete"), key).fetchone() or (0, [])
    gone = retention.drop_attachments(cur, list(hashes))
    done.conversations.append(channel)
    done.events += int(events)
    done.event_ids += ids
    done.sessions += [(channel, s) for s in sids]
    done.attachments += len(gone)
    done.hashes += [bytes(h).hex() for h in gone]
    _forget_notices(cur, key, ids, sids, found.at, whole=True)


def _redact(
    cur: Cursor, agent: str, channel: str, rows: Sequence[tuple[int, str, Any]], erase_id: str
) -> None:
    payloads = [erasure.redact_payload(p, erase_id) for _, _, p in rows]
    params = {
        "agent": agent,
        "channels": [channel] * len(rows),
        "seqs": [s for s, _, _ in rows],
        "payloads": [msgspec.json.encode(p).decode() for p in payloads],
    }
    cur.execute(query("redact_events"), params)


def _settle(cur: Cursor, e: ev.EraseRequested, channel: str, found: Targets, done: Done) -> None:
    """Make again, in one conversation, what was derived from the redacted events."""
    key = {"agent": e.agent, "channel": channel}
    erase_id = str(e.erase_id)
    marked = cur.execute(
        query("erased_by"), {**key, "before": found.before, "erase_id": erase_id}
    ).fetchall()
    if not marked:
        return
    seqs = [int(s) for s, _, _, _ in marked]
    messages = [(t, int(s)) for s, t, kind, _ in marked if kind in _MESSAGES]
    done.touched.append(channel)
    done.events += len(found.redact.get(channel, ()))
    done.event_ids += [str(i) for _, _, _, i in marked]
    cur.execute(query("erase_search_rows"), {**key, "seqs": seqs})
    hashes = [bytes(h) for (h,) in cur.execute(query("erase_refs"), {**key, "seqs": seqs})]
    gone = retention.drop_attachments(cur, sorted(set(hashes)))
    done.attachments += len(gone)
    done.hashes += [h.hex() for h in gone]
    target = found.session[1] if found.session and found.session[0] == channel else ""
    touched = _retake_sessions(cur, e, key, seqs, target, done)
    threads = {"threads": [t for t, _ in messages], "seqs": [s for _, s in messages]}
    scope = {**key, "before": found.before, **threads}
    # Every event whose text changes is named to the scrub (its inbound entry may wait).
    done.event_ids += [str(i) for (i,) in cur.execute(query("blank_compactions"), scope)]
    done.event_ids += _erase_api_blocks(cur, scope)
    cur.execute(query("erase_threads"), {**scope, "summary_erased": erasure.SUMMARY_ERASED})
    if touched:
        blanked = cur.execute(
            query("blank_session_summaries"),
            {**key, "before": found.before, "sessions": touched},
        )
        done.event_ids += [str(i) for (i,) in blanked]
        policy.forget_sessions(cur, e.agent, channel, touched, "erase", ERASED_WHY)
    cur.execute(query("recount_headers"), key)
    ids = [str(i) for _, _, _, i in marked]
    _forget_notices(cur, key, ids, touched, found.at, whole=False)


_MESSAGES: Final = frozenset({"message.v1", "imported_message.v1"})


def _retake_sessions(
    cur: Cursor, e: ev.EraseRequested, key: dict[str, Any], seqs: list[int], target: str, done: Done
) -> list[str]:
    """Sessions of the conversation holding what was erased: their id kept in the event
    that made them, their description, preview and summary taken again (a session erase's
    own session is removed). Returns their ids."""
    rows = cur.execute(
        query("tainted_sessions"), {**key, "seqs": seqs, "session_id": target}
    ).fetchall()
    out = []
    for sid, seq, _round, first in rows:
        params = {**key, "session_id": sid, "seq": seq, "erase_id": str(e.erase_id)}
        cur.execute(query("keep_session_id"), params)
        if sid == target:
            cur.execute(query("drop_session"), params)
        else:
            preview = sessions.preview(blocks.text_of(first or ""))
            retaken = rows_as(cur, Retaken)
            row = retaken.execute(
                query("retake_session"), {**params, "preview": preview}
            ).fetchone()
            if row is not None and row.live:
                done.summaries.append(Summarize(e.agent, key["channel"], sid, row.summary_round))
        done.sessions.append((key["channel"], sid))
        out.append(sid)
    return out


def _erase_api_blocks(cur: Cursor, scope: dict[str, Any]) -> list[str]:
    """The API's compaction blocks posted after an erased message of their thread (they
    summarise it) say their summary was removed; the rest of those answers stays.
    Returns their event ids."""
    rows = cur.execute(query("compaction_answers"), scope).fetchall()
    if not rows:
        return []
    payloads = [_without_summary(p) for _, p, _ in rows]
    params = {
        "agent": scope["agent"],
        "channels": [scope["channel"]] * len(rows),
        "seqs": [s for s, _, _ in rows],
        "payloads": [msgspec.json.encode(p).decode() for p in payloads],
    }
    cur.execute(query("redact_events"), params)
    return [str(i) for _, _, i in rows]


def _without_summary(payload: dict[str, Any]) -> dict[str, Any]:
    content = payload.get("content")
    if not isinstance(content, list):
        return payload
    blocks = [
        {"type": "compaction", "content": erasure.SUMMARY_ERASED}
        if isinstance(b, dict) and b.get("type") == "compaction" and b.get("content") is not None
        else b
        for b in content
    ]
    return {**payload, "content": blocks}


def _forget_notices(
    cur: Cursor,
    key: dict[str, Any],
    ids: list[str],
    sids: list[str],
    at: dt.datetime,
    *,
    whole: bool,
) -> None:
    """Notices not yet relayed, their webhook deliveries, and export files, that may tell
    what was erased."""
    params = {
        "agent": key["agent"],
        "channel": key["channel"],
        "event_ids": ids,
        "sessions": sids,
        "whole": whole,
        "at": at,
    }
    cur.execute(query("erase_pending_notices"), params)
    cur.execute(query("erase_webhook_deliveries"), params)
    cur.execute(query("erase_exports"), params)


def scrub_effect(e: ev.EraseRequested, done: Done) -> Scrub:
    """What Redis may still hold of what the erase reached (`effects.scrub`)."""
    return Scrub(
        agent=e.agent,
        shard=e.shard,
        erase_event=str(e.event_id),
        scope=e.scope,
        subject=e.subject,
        dropped=done.conversations,
        channels=sorted(set(done.touched) | set(done.conversations)),
        event_ids=done.event_ids,
        sessions=[list(s) for s in done.sessions],
        hashes=done.hashes,
    )
