"""The erase contract: how a subject is named (hashed), where an `erase.v1` goes, and what
an erased event looks like afterwards (redaction in place).

Why redaction in place, and not per-subject keys (crypto-shredding) or tombstones: the
log is read by position (a thread's segment is a range of seqs, a session a list of
them), and other people's turns sit between the subject's. Redacting the subject's
events where they are keeps every position, every tool call paired with its result and
every running total; projections, sessions and contexts stay valid for the rest of the
conversation, and a replay (`contextlog rebuild`) gives the erased state. Encrypting
content per sender would put a key lookup on every read and a decryption on every
context; tombstones would leave holes that every read would have to step around. What
remains of an erased event: its identity (event id, conversation, seq, time, kind), its
structure (roles, block types, tool ids and names: what keeps the API's pairing rules),
its token estimate, and `erased` (the erase's id) - no text, input, attachment, sender or
thinking.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
import zlib
from collections.abc import Mapping
from typing import Any, Final

from contextlog.schema.blocks import COMPACTION
from contextlog.schema.events import EraseRequested, EraseScope

ERASED_TEXT: Final = "[erased]"
# The prefix of the channel that holds a shard's erase events (`erase_channel`).
ERASE_CHANNEL: Final = "contextlog:erase:"
# Summaries (ours and the API's compaction blocks) that drew on erased messages are
# replaced by this in the projections; in the log they are overwritten with filler of the
# same length (`filler`), so a replay makes the same decisions the live log made.
SUMMARY_ERASED: Final = (
    "(An earlier part of this conversation was summarised here; the summary was removed "
    "because some of what it summarised was erased.)"
)


def subject_hash(agent: str, kind: str, name: str) -> str:
    """The hash that names a subject in an `erase.v1`: sha256 over the agent, the kind of
    name (channel, sender, session) and the name, so one person's hash differs by agent."""
    return hashlib.sha256(f"{agent}\x00{kind}\x00{name}".encode()).hexdigest()


def shard_of(agent: str, channel: str, shards: int) -> int:
    """`keys.shard_of`, repeated here so the contract needs nothing from `keys`."""
    key = agent.encode() + b"\x00" + channel.encode()
    return zlib.crc32(key) % shards


def erase_channel(agent: str, shard: int, shards: int) -> str:
    """The channel of `agent` whose erase events go to `shard`: the first
    `contextlog:erase:<k>` that hashes to it (a conversation of its own, so the erase
    record holds no subject's channel and is kept by retention)."""
    k = 0
    while shard_of(agent, f"{ERASE_CHANNEL}{k}", shards) != shard:
        k += 1
    return f"{ERASE_CHANNEL}{k}"


def filler(text: str) -> str:
    """A string as long as `text` (in characters) that says it was erased: what an erased
    summary becomes in the log, so every length-based count (header tokens, budget cuts)
    replays as it happened."""
    if not text:
        return text
    unit = ERASED_TEXT + " "
    return (unit * (len(text) // len(unit) + 1))[: len(text)]


def _blank(text: object) -> bool:
    return not isinstance(text, str) or not text.strip()


def _text(original: object) -> str:
    """Erased text: blank stays blank (what counts as an empty turn does not change)."""
    return original if isinstance(original, str) and _blank(original) else ERASED_TEXT


def redact_block(block: Any) -> dict[str, Any] | None:
    """One content block, erased; None to drop it (thinking, and server tool calls with
    their results, which only go in pairs)."""
    if not isinstance(block, Mapping):
        return {"type": "text", "text": ERASED_TEXT}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": _text(block.get("text"))}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}
    if kind == "tool_result":
        out: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.get("tool_use_id")}
        if block.get("is_error") is not None:
            out["is_error"] = block["is_error"]
        inner = block.get("content")
        if inner not in (None, "", []):
            out["content"] = ERASED_TEXT
        return out
    if kind == COMPACTION:
        summary = block.get("content")
        return {
            "type": COMPACTION,
            "content": filler(summary) if isinstance(summary, str) else None,
        }
    if kind in ("thinking", "redacted_thinking") or str(kind).startswith(("server_", "mcp_")):
        return None
    if isinstance(kind, str) and kind.endswith("_tool_result"):
        return None
    return {"type": "text", "text": ERASED_TEXT}  # images, documents, search results...


def redact_content(content: Any) -> Any:
    """A message's content with its text, inputs, results, attachments and thinking
    erased, its structure kept (see the module doc)."""
    if isinstance(content, str):
        return _text(content)
    if not isinstance(content, list):
        return ERASED_TEXT
    kept = [b for b in map(redact_block, content) if b is not None]
    if not any(b["type"] != "text" or not _blank(b.get("text")) for b in kept):
        kept.append({"type": "text", "text": ERASED_TEXT})
    return kept


# Fields of an event's payload that carry what a person said or typed (beyond `content`):
# removed where the contract lets them be absent, else filler of the same length.
OPTIONAL_TEXT: Final = ("description",)
REQUIRED_TEXT: Final = ("query", "summary")
# Fields that are only provenance and may name the person: removed.
PERSONAL: Final = ("sender", "external_id")


def redact_payload(payload: Mapping[str, Any], erase_id: str) -> dict[str, Any]:
    """An event's stored payload, erased: content redacted, free text and the sender
    removed (a summary or a query: filler of the same length), `erased` set. Idempotent."""
    out = {k: v for k, v in payload.items() if k not in PERSONAL}
    if "content" in out:
        out["content"] = redact_content(out["content"])
    for name in OPTIONAL_TEXT:
        if isinstance(out.get(name), str):
            out[name] = None
    for name in REQUIRED_TEXT:
        if isinstance(out.get(name), str):
            out[name] = filler(out[name])
    if isinstance(out.get("block"), Mapping):
        out["block"] = redact_block(out["block"])
    out = {k: v for k, v in out.items() if v is not None or k == "content"}
    mark = dict(payload.get("erased") or {})
    mark.setdefault("erase_id", erase_id)
    out["erased"] = mark
    return out


# The namespace of the event ids of an erase request's events (one per shard it goes to).
NAMESPACE: Final = uuid.UUID("2f7d3a51-6c0e-4a55-8c43-0d9a1e6b7c20")


def request(
    agent: str,
    *,
    shards: int,
    now: dt.datetime,
    channel: str | None = None,
    sender: str | None = None,
    session_id: str | None = None,
    source: str | None = None,
    erase_id: uuid.UUID | None = None,
) -> list[EraseRequested]:
    """The events of one erase: a conversation (`channel`), a session of it (`channel` and
    `session_id`) or a sender across the agent's conversations (`sender`: one event per
    shard). Each goes to its shard's erase channel, and its id derives from the erase's,
    so sending the request again stores nothing twice. Bad combinations: `ValueError`."""
    scope, subject, session = _subject(agent, channel, sender, session_id)
    erase = erase_id or uuid.uuid4()
    if scope == "sender":
        wanted = list(range(shards))
    else:
        assert channel is not None
        wanted = [shard_of(agent, channel, shards)]
    return [
        EraseRequested(
            event_id=uuid.uuid5(NAMESPACE, f"{erase}:{shard}"),
            agent=agent,
            channel=erase_channel(agent, shard, shards),
            source=source,
            occurred_at=now,
            erase_id=erase,
            scope=scope,
            subject=subject,
            session=session,
            shard=shard,
            shards=shards,
        )
        for shard in wanted
    ]


def _subject(
    agent: str, channel: str | None, sender: str | None, session_id: str | None
) -> tuple[EraseScope, str, str | None]:
    if sender is not None:
        if channel is not None or session_id is not None:
            raise ValueError("erase a sender across the agent's conversations: give no channel")
        return "sender", subject_hash(agent, "sender", sender), None
    if channel is None:
        raise ValueError("erase what: give a channel (and a session id) or a sender")
    if session_id is not None:
        return (
            "session",
            subject_hash(agent, "channel", channel),
            subject_hash(agent, "session", session_id),
        )
    return "conversation", subject_hash(agent, "channel", channel), None
