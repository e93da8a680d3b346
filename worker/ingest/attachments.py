"""Ingest's side of attachments: bring the bytes a batch references from Redis into the
batch's transaction, and forget them in Redis once committed.

A stream entry carries only references (`schema.attachments`); the producer wrote the
bytes to `contextlog:attachment:{shard}:<sha256>` with the entry. Before a batch is
stored, the hashes it references that Postgres does not hold yet are read from Redis and
checked (sha256 and size: the only look ingest takes at the bytes; no base64 here), and
go into the `attachments` table in the batch's transaction. An entry whose bytes are
neither stored nor in Redis (its key expired during a long outage) is dead-lettered
with that reason; the rest of the batch goes on. After commit the keys are deleted: a
later entry with the same hash finds it stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from contextlog.schema import attachments, codec, keys
from contextlog.schema import events as ev
from contextlog.worker.ingest.streams import Rejected
from contextlog.worker.store.batch import Accepted, EventLog

# Attachment bytes one transaction brings at most (a batch of many large attachments is
# stored in several transactions, in order), so ingest's memory stays bounded.
BATCH_BYTES: Final = 64 << 20


def refs_of(event: ev.AnyEvent) -> list[Mapping[str, Any]]:
    """The attachment references of a message event (none for others)."""
    if not isinstance(event, ev.MessagePosted | ev.MessageImported) or isinstance(
        event.content, str
    ):
        return []
    if not any(_MARKER in bytes(b) for b in event.content):
        return []
    return attachments.refs([msgspec.json.decode(b) for b in event.content])


_MARKER: Final = b'"' + attachments.SOURCE_TYPE.encode() + b'"'


def any_refs(batch: Sequence[Accepted]) -> bool:
    """Whether an entry of the batch may reference an attachment: one look at the bytes
    of each message with content blocks (only those have references, `refs_of`), so a
    batch without any costs ingest next to nothing."""
    return any(
        _MARKER in a.payload
        for a in batch
        if isinstance(a.event, ev.MESSAGES) and not isinstance(a.event.content, str)
    )


def groups(batch: Sequence[Accepted], limit: int = BATCH_BYTES) -> Iterator[list[Accepted]]:
    """The batch in order, cut so no part references more than `limit` attachment bytes
    (an entry over it alone goes alone)."""
    part: list[Accepted] = []
    seen: set[str] = set()
    size = 0
    for a in batch:
        refs = {str(r["sha256"]): int(r["size"]) for r in refs_of(a.event)}
        more = sum(n for h, n in refs.items() if h not in seen)
        if part and size + more > limit:
            yield part
            part, seen, size = [], set(), 0
            more = sum(refs.values())
        part.append(a)
        seen.update(refs)
        size += more
    if part:
        yield part


def resolve(
    client: Any, known: EventLog, shard: int, batch: Sequence[Accepted]
) -> tuple[list[Accepted], list[Rejected]]:
    """The entries with the bytes they bring (`Accepted.blobs`), and those to dead-letter
    because bytes they reference are missing or not what the reference says."""
    wanted = {
        a.entry_id: {str(r["sha256"]): int(r["size"]) for r in refs_of(a.event)} for a in batch
    }
    every = sorted({h for refs in wanted.values() for h in refs})
    if not every:
        return list(batch), []
    stored = known.stored_attachments(every)
    needed = [h for h in every if h not in stored]
    found = (
        dict(zip(needed, client.mget([keys.attachment(shard, h) for h in needed]), strict=True))
        if needed
        else {}
    )
    accepted: list[Accepted] = []
    rejected: list[Rejected] = []
    for a in batch:
        blobs: dict[str, bytes] = {}
        problem = None
        for sha, size in wanted[a.entry_id].items():
            if sha in stored:
                continue
            data = found.get(sha)
            problem = _problem(sha, size, data)
            if problem:
                break
            assert data is not None
            blobs[sha] = data
        if problem:
            reason = attachments.MISSING if found.get(sha) is None else codec.INVALID
            rejected.append(Rejected(a.entry_id, {codec.ENTRY_FIELD: a.payload}, reason, problem))
        else:
            accepted.append(a._replace(blobs=blobs) if blobs else a)
    return accepted, rejected


def _problem(sha: str, size: int, data: bytes | None) -> str | None:
    if data is None:
        return (
            f"attachment {sha} is not stored and its bytes are no longer in Redis (kept "
            f"{attachments.TTL_VAR} seconds): post the message again"
        )
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
        return f"attachment {sha}: the bytes in Redis do not match its reference"
    return None


def forget(client: Any, shard: int, batch: Sequence[Accepted]) -> None:
    """After commit: delete the Redis keys of every attachment the batch referenced (all
    are stored now; a key already gone is fine)."""
    if not any_refs(batch):
        return
    names = sorted(
        {keys.attachment(shard, str(r["sha256"])) for a in batch for r in refs_of(a.event)}
    )
    if names:
        client.delete(*names)
