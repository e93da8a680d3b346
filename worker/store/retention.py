"""`contextlog retire`: the retention story of the append-only log (issue 14.3).

Nothing ever leaves the log on its own (invariant 3). An operator retires whole
conversations that have been silent for a while: each one's events are written to an
archive file (JSON lines, every column) and fsynced, and only then, in the same
transaction that re-checked it under the conversation's row lock, its events and its
projection rows (conversation, threads, sessions) are deleted, so the projections stay
what a replay of the remaining log gives. A conversation with a live (not deleted)
session is refused: the session references its events. `restore` puts an archive's
rows back with their positions and seqs; `contextlog rebuild` then derives the
projections again. Attachments stay (stored once by hash, other conversations may hold
the same bytes; an archive references them).

`drop` is the same step for the retention policy (worker/store/policy.py): each
conversation with a cut-off of its own, the archive optional, and without an archive the
attachments that no other event references are deleted too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

import psycopg
from psycopg.rows import TupleRow

from contextlog.schema.errors import Refused
from contextlog.schema.queries import query
from contextlog.worker.store.locks import REBUILD_LOCK

ARCHIVE_PREFIX: Final = "retired-"
RESTORE_CHUNK: Final = 5_000


@dataclass
class Retired:
    """What a retire run did."""

    archive: Path
    conversations: list[tuple[str, str]] = field(default_factory=list)
    events: int = 0
    referenced: list[tuple[str, str]] = field(default_factory=list)  # refused: live sessions


def archive_path(directory: Path, now: dt.datetime) -> Path:
    """A new archive file in `directory`, named by the run's time (never a user's name)."""
    stamp = now.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return directory / f"{ARCHIVE_PREFIX}{stamp}.jsonl"


def retire(
    conn: psycopg.Connection[TupleRow],
    directory: Path,
    *,
    now: dt.datetime,
    idle_for: dt.timedelta,
    limit: int = 1000,
) -> Retired:
    """Archive then delete the conversations silent since `now - idle_for` (at most
    `limit` of them); those a live session references are refused and listed."""
    if idle_for <= dt.timedelta(0):
        raise Refused("retire: the idle period must be positive")
    if not directory.is_dir():
        raise Refused(f"retire: the archive directory {str(directory)!r} does not exist")
    before = now - idle_for
    rows = conn.execute(query("retire_candidates"), {"before": before, "limit": limit})
    candidates = rows.fetchall()
    conn.rollback()
    done = Retired(archive_path(directory, now))
    done.referenced = [(a, c) for a, c, referenced in candidates if referenced]
    free = [(a, c) for a, c, referenced in candidates if not referenced]
    if not free:
        return done
    with done.archive.open("x", encoding="utf-8") as out:
        for agent, channel in free:
            n = _retire_one(conn, out, agent, channel, before)
            if n is not None:
                done.conversations.append((agent, channel))
                done.events += n
    return done


def drop(
    conn: psycopg.Connection[TupleRow],
    due: list[tuple[str, str, dt.datetime]],
    *,
    archive: Path | None,
    now: dt.datetime,
) -> Retired:
    """Drop each (agent, channel) still silent since its own cut-off and unreferenced,
    archived into a new file in `archive` when given (else its unreferenced attachments
    go too); one transaction each. Returns what went (`archive`: the file, or none)."""
    done = Retired(Path())
    if not due:
        return done
    with contextlib.ExitStack() as stack:
        out = None
        if archive is not None:
            done.archive, out = _new_archive(archive, now)
            stack.enter_context(out)
        for agent, channel, before in due:
            n = _retire_one(conn, out, agent, channel, before)
            if n is not None:
                done.conversations.append((agent, channel))
                done.events += n
    return done


def _new_archive(directory: Path, now: dt.datetime) -> tuple[Path, IO[str]]:
    """A new archive file for a run at `now` (a second run at the same instant, after a
    crash, gets `-2`, `-3`...): created here, never an existing one overwritten."""
    first = archive_path(directory, now)
    n = 1
    while True:
        path = first if n == 1 else first.with_name(f"{first.stem}-{n}{first.suffix}")
        try:
            return path, path.open("x", encoding="utf-8")
        except FileExistsError:
            n += 1


def _retire_one(
    conn: psycopg.Connection[TupleRow],
    out: IO[str] | None,
    agent: str,
    channel: str,
    before: dt.datetime,
) -> int | None:
    """One conversation, in its own transaction: None if it woke up or got a session.
    Archived into `out` first when given; else the attachments it alone referenced go."""
    key = {"agent": agent, "channel": channel, "before": before, "rebuild_lock": REBUILD_LOCK}
    with conn.transaction(), conn.cursor() as cur:
        if cur.execute(query("retire_lock"), key).fetchone() is None:
            return None
        if out is not None:
            for (line,) in cur.execute(query("retire_events"), key):
                out.write(line + "\n")
            # On disk before the rows go: a crash after this leaves them in both places
            # (a restore then refuses, the log still has them), never in neither.
            out.flush()
            os.fsync(out.fileno())
        (deleted, hashes) = cur.execute(query("retire_delete"), key).fetchone() or (0, [])
        if out is None:
            drop_attachments(cur, list(hashes))
    return int(deleted)


def drop_attachments(cur: psycopg.Cursor[TupleRow], hashes: list[bytes]) -> list[bytes]:
    """Delete those of these attachments that no event references any more (in the
    caller's transaction, after their references went); returns the ones deleted. Each is
    locked first, so a batch that references one concurrently is seen (or fails, CL002,
    and is read again)."""
    if not hashes:
        return []
    cur.execute(query("lock_attachments"), {"hashes": hashes})
    rows = cur.execute(query("drop_unreferenced_attachments"), {"hashes": hashes}).fetchall()
    return [bytes(sha) for (sha,) in rows]


def restore(conn: psycopg.Connection[TupleRow], archive: Path) -> int:
    """Put an archive's events back (run `contextlog rebuild` after); returns how many.
    Refused when the log already holds events of one of its conversations."""
    try:
        lines = archive.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise Refused(f"restore: cannot read the archive {str(archive)!r}: {e}") from e
    rows = [_decoded(archive, i, line) for i, line in enumerate(lines, 1) if line]
    convs = sorted({(str(r["agent"]), str(r["channel"])) for r in rows})
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (REBUILD_LOCK,))
        params = {"agents": [a for a, _ in convs], "channels": [c for _, c in convs]}
        present = conn.execute(query("unretire_present"), params).fetchall()
        if present:
            names = ", ".join(f"{a}/{c}" for a, c in present[:5])
            raise Refused(f"restore: the log already holds events of {names}; nothing restored")
        for chunk in _chunks(rows, RESTORE_CHUNK):
            conn.execute(query("unretire_insert"), {"rows": json.dumps(chunk)})
    return len(rows)


def _decoded(archive: Path, number: int, line: str) -> dict[str, object]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise Refused(f"restore: {archive.name} line {number} is not JSON: {e}") from e
    if not isinstance(row, dict) or not {"agent", "channel", "seq", "position"} <= row.keys():
        raise Refused(f"restore: {archive.name} line {number} is not an archived event")
    return row


def _chunks(rows: list[dict[str, object]], size: int) -> Iterator[list[dict[str, object]]]:
    for i in range(0, len(rows), size):
        yield rows[i : i + size]
