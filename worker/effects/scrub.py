"""What Redis still holds of an erase's subject, taken out after the erase committed
(the `Scrub` effect; worker/store/erase.py says what it reached in Postgres).

- the shard's inbound stream: entries before the erase's own entry are stored (ingest
  applies a shard's entries in order) and wait only for the trim; the subject's go now.
  Entries after it are newer than the erase and are not touched;
- the shard's dead letters (and the single stream of versions before Redis Cluster
  support): the subject's entries, matched on the fields an entry carries (the sender,
  hashed; the conversation; the event id), read from the JSON or, when that is broken
  (it was dead-lettered for it), from the bytes;
- every adapter's notifications: notices about an erased event, summaries of a touched
  session, search results in a touched conversation, all of a dropped one;
- attachment bytes still waiting for ingest, of the attachments the erase deleted;
- RQ job records that name a touched session or a dropped conversation (summaries,
  compactions), and a dropped conversation's idle timer.

What an adapter has already read, Redis' own persistence files (RDB, AOF) until they are
rewritten, and a replica's copies are beyond reach (README, "Erase").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Final

import msgspec
import redis
import structlog
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from contextlog.schema import codec, erasure, keys
from contextlog.schema import notices as nt
from contextlog.schema.errors import EventRejected
from contextlog.worker.effects.kinds import Scrub
from contextlog.worker.tasks.queue import compaction_job_id, summary_job_id
from contextlog.worker.tasks.timers import timer_key

log = structlog.get_logger("contextlog.scrub")

PAGE: Final = 1000
ROUNDS: Final = 16  # summary rounds whose job records are looked for
_NAMES: Final = ("agent", "channel", "sender", "event_id")
_FIELD: Final = re.compile(rb'"(agent|channel|sender|event_id)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_DONE: Final = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


@dataclass
class Scrubbed:
    """What a scrub took out (or, dry, would take)."""

    stream_entries: int = 0
    dead_letters: int = 0
    notices: int = 0
    attachment_keys: int = 0
    jobs: int = 0
    timers: int = 0

    def total(self) -> int:
        """Everything taken."""
        return sum(getattr(self, f.name) for f in fields(self))


def names(data: bytes) -> dict[str, str]:
    """An entry's agent, channel, sender and event id: from its JSON, or from its bytes
    when it does not decode (a dead letter, cut or malformed)."""
    try:
        obj = msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        return {k: v for k in _NAMES if isinstance(v := obj.get(k), str)}
    found: dict[str, str] = {}
    for key, raw in _FIELD.findall(data):
        try:
            value = msgspec.json.decode(b'"' + raw + b'"')
        except msgspec.DecodeError:
            continue
        found.setdefault(key.decode(), value)
    return found


@dataclass
class Match:
    """The erase's subject, as Redis entries are matched against it."""

    s: Scrub
    ids: frozenset[str] = field(init=False)
    dropped: frozenset[str] = field(init=False)
    channels: frozenset[str] = field(init=False)
    sessions: frozenset[tuple[str, str]] = field(init=False)

    def __post_init__(self) -> None:
        self.ids = frozenset(self.s.event_ids)
        self.dropped = frozenset(self.s.dropped)
        self.channels = frozenset(self.s.channels)
        self.sessions = frozenset((c, sid) for c, sid in self.s.sessions)

    def entry(self, found: dict[str, str]) -> bool:
        """Whether an inbound or dead-lettered entry (its `names`) is the subject's."""
        if found.get("agent") != self.s.agent:
            return False
        if found.get("event_id") in self.ids or found.get("channel") in self.dropped:
            return True
        sender = found.get("sender")
        return (
            self.s.scope == "sender"
            and sender is not None
            and erasure.subject_hash(self.s.agent, "sender", sender) == self.s.subject
        )

    def notice(self, n: nt.Notice) -> bool:
        """Whether a notice may tell what was erased."""
        if n.agent != self.s.agent or n.channel not in self.channels:
            return False
        return (
            n.channel in self.dropped
            or n.event_id in self.ids
            or n.kind == nt.SEARCH_RESULTS
            or (n.kind == nt.SUMMARY_READY and (n.channel, n.session_id or "") in self.sessions)
        )


class Scrubber:
    """Takes an erase's subject out of Redis: `client` is REDIS_URL's (streams, dead
    letters, notifications, attachment bytes), `queue` the queue Redis (RQ, timers)."""

    def __init__(self, client: Any, queue: redis.Redis | None = None) -> None:
        self.redis: Any = client
        self.queue = queue

    def scrub(self, s: Scrub, *, dry: bool = False) -> Scrubbed:
        """Take it out (`dry`: only count); every step is idempotent."""
        match, out = Match(s), Scrubbed()
        out.stream_entries = self._inbound(s, match, dry)
        out.dead_letters = self._dead_letters(s, match, dry)
        out.notices = self._notices(match, dry)
        out.attachment_keys = self._attachments(s, dry)
        if self.queue is not None:
            out.jobs, out.timers = self._jobs(s, dry)
        if out.total() and not dry:
            log.info("erase scrubbed from Redis", agent=s.agent, shard=s.shard, **vars(out))
        return out

    def _inbound(self, s: Scrub, match: Match, dry: bool) -> int:
        """The subject's entries before the erase's own in the shard's stream (a dry run,
        whose erase is not in the stream: all of them, which it would come after)."""
        stream = keys.stream(s.shard)
        gone: list[bytes] = []
        for entry_id, fields_ in _pages(self.redis, stream):
            data = fields_.get(codec.ENTRY_FIELD)
            if data is None:
                continue
            found = names(data)
            if found.get("event_id") == s.erase_event:
                return self._delete(stream, gone, dry)
            if match.entry(found):
                gone.append(entry_id)
        if dry:
            return len(gone)
        return 0  # its entry is trimmed: everything left is newer than the erase

    def _dead_letters(self, s: Scrub, match: Match, dry: bool) -> int:
        streams = [keys.dead_letters(s.shard)]
        if s.scope != "sender" or s.shard == 0:  # the legacy stream once, not per shard
            streams.append(keys.LEGACY_DEAD_LETTERS)
        total = 0
        original = b"orig:" + codec.ENTRY_FIELD
        for stream in streams:
            gone = [
                entry_id
                for entry_id, fields_ in _pages(self.redis, stream)
                if match.entry(names(fields_.get(original, b"")))
            ]
            total += self._delete(stream, gone, dry)
        return total

    def _notices(self, match: Match, dry: bool) -> int:
        total = 0
        for raw in self.redis.scan_iter(match=keys.outbox("*"), count=PAGE):
            stream = raw.decode() if isinstance(raw, bytes) else raw
            gone = [
                entry_id
                for entry_id, fields_ in _pages(self.redis, stream)
                if (n := _notice(fields_)) is not None and match.notice(n)
            ]
            total += self._delete(stream, gone, dry)
        return total

    def _attachments(self, s: Scrub, dry: bool) -> int:
        names_ = [keys.attachment(s.shard, h) for h in s.hashes]
        if not names_:
            return 0
        if dry:
            return int(self.redis.exists(*names_))
        return int(self.redis.delete(*names_))

    def _jobs(self, s: Scrub, dry: bool) -> tuple[int, int]:
        """Finished or failed job records naming a touched session; every job and the idle
        timer of a dropped conversation."""
        assert self.queue is not None
        dropped = set(s.dropped)
        wanted = [
            (summary_job_id(s.agent, c, sid, r), c in dropped)
            for c, sid in s.sessions
            for r in range(ROUNDS)
        ]
        wanted += [(compaction_job_id(s.agent, c), True) for c in s.dropped]
        jobs = sum(self._job(i, any_state=whole, dry=dry) for i, whole in wanted)
        timers = [timer_key(s.agent, c) for c in s.dropped]
        if not timers or dry:
            return jobs, sum(int(self.queue.exists(t)) for t in timers)
        for t in timers:
            bucket = self.queue.hget(t, "bucket")
            if bucket:
                self.queue.hdel(bucket, t)
        return jobs, int(self.queue.delete(*timers))

    def _job(self, job_id: str, *, any_state: bool, dry: bool) -> int:
        assert self.queue is not None
        if not self.queue.exists(f"rq:job:{job_id}"):
            return 0
        try:
            job = Job.fetch(job_id, connection=self.queue)
            status = job.get_status(refresh=True)
            if not any_state and status not in _DONE:
                return 0  # queued or running: it reads the redacted log
            if not dry:
                if status not in _DONE:
                    job.cancel()
                job.delete()
        except (NoSuchJobError, ValueError):
            return 0
        return 1

    def _delete(self, stream: str, ids: list[bytes], dry: bool) -> int:
        if not ids:
            return 0
        if dry:
            return len(ids)
        return sum(
            int(self.redis.xdel(stream, *ids[i : i + PAGE])) for i in range(0, len(ids), PAGE)
        )


def _notice(fields_: dict[bytes, bytes]) -> nt.Notice | None:
    data = fields_.get(nt.ENTRY_FIELD.encode())
    if data is None:
        return None
    try:
        return nt.decode(data)
    except EventRejected:
        return None


def _pages(client: Any, stream: str) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
    """Every entry of a stream, oldest first, a page at a time."""
    start = "-"
    while True:
        page = client.xrange(stream, min=start, max="+", count=PAGE)
        yield from page
        if len(page) < PAGE:
            return
        last = page[-1][0]
        start = "(" + (last.decode() if isinstance(last, bytes) else last)
