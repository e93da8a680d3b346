"""`contextlog erase`: erase a conversation, a session's messages, or a sender across an
agent's conversations (worker/store/erase.py does it, in ingest); `--dry-run` says what
would go without changing anything.

A dry run applies the erase in a transaction that it rolls back, with the same code
ingest runs, and counts what the Redis scrub would take; so what it lists is what the
erase does, as of now. A real one pushes the `erase.v1` events (`Producer.erase`), waits
for ingest's `erase_done` for each of them, then deletes the export files this host wrote
that the erase reached (`contextlog export` records each one it writes).

Where the HTTP API (`worker/api/`, issue 33) exposes erase, it calls `Producer.erase` as
this does, behind an operator's key; what it cannot do is the last step, deleting export
files, which only a process on the host that wrote them can.
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from contextlog.schema import erasure
from contextlog.schema import events as ev
from contextlog.schema.queries import query
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.cli import answers
from contextlog.worker.cli import common as cli_common
from contextlog.worker.cli.common import EXIT_ERROR
from contextlog.worker.effects.scrub import Scrubbed, Scrubber
from contextlog.worker.store import erase as store

# How far past the log a dry run looks: everything stored so far.
EVERYTHING = 1 << 62


def cmd_erase(settings: Settings, args: argparse.Namespace) -> int:
    """Erase, or list what an erase would remove (`--dry-run`)."""
    try:
        events = erasure.request(
            args.agent,
            shards=settings.shards,
            now=SystemClock().now(),
            channel=args.channel,
            sender=args.sender,
            session_id=args.session,
            source=args.source,
        )
    except ValueError as e:
        print(f"contextlog: erase: {e}", file=sys.stderr)
        return EXIT_ERROR
    if args.dry_run:
        return _dry_run(settings, events)
    producer = cli_common.producer(settings, operator=True)
    try:
        after = answers.stream_end(producer.redis, args.source)
        ids = producer.push_many(events)
        print(f"erase {events[0].erase_id} sent ({len(ids)} events)", flush=True)
        got = answers.answers(producer.redis, args.source, after, ids, args.wait)
    finally:
        producer.close()
    for notice in got.values():
        print(notice.text or notice.kind)
    files = delete_exports(settings)
    for path, why in files:
        print(f"export file {path}: {why}")
    if len(got) < len(ids):
        print(
            f"contextlog: note: {len(ids) - len(got)} of {len(ids)} erase events not applied "
            f"within {args.wait:g} s; ingest applies them when it reaches them (`contextlog "
            "status`); run `contextlog erase` again later to delete export files",
            file=sys.stderr,
        )
    return 0


def _dry_run(settings: Settings, events: list[ev.EraseRequested]) -> int:
    done, files = plan(settings, events)
    scrubbed = Scrubbed()
    client = cli_common.redis_client(settings)
    scrubber = Scrubber(client, cli_common.queue_client(settings))
    for e, d in zip(events, done, strict=True):
        got = scrubber.scrub(store.scrub_effect(e, d), dry=True)
        for name, value in vars(got).items():
            setattr(scrubbed, name, getattr(scrubbed, name) + value)
    client.close()
    _report(events[0], done, scrubbed, files)
    return 0


def plan(
    settings: Settings, events: list[ev.EraseRequested]
) -> tuple[list[store.Done], list[tuple[str, str]]]:
    """What each erase event would do now, and the export files (host, path) it would
    reach: applied in a transaction that is rolled back."""
    out = []
    at = SystemClock().now()
    with (
        cli_common.pg_connect(settings) as conn,
        conn.transaction(force_rollback=True),
        conn.cursor() as cur,
    ):
        waiting = set(cur.execute(query("erased_export_paths")).fetchall())
        for e in events:
            out.append(store.apply(cur, e, store.targets(cur, e, EVERYTHING, at)))
        reached = set(cur.execute(query("erased_export_paths")).fetchall()) - waiting
    return out, sorted((str(h), str(p)) for h, p in reached)


def _report(
    e: ev.EraseRequested, done: list[store.Done], redis: Scrubbed, files: list[tuple[str, str]]
) -> None:
    dropped = sorted({c for d in done for c in d.conversations})
    touched = sorted({c for d in done for c in d.touched})
    sessions = sorted({s for d in done for s in d.sessions})
    print(f"erase ({e.scope}) would remove, as of now (dry run: nothing changed):")
    print(f"  conversations dropped whole: {len(dropped)} {', '.join(dropped)}")
    print(
        f"  events redacted or dropped: {sum(d.events for d in done)}"
        + (f" (redacted in {', '.join(touched)})" if touched else "")
    )
    names = ", ".join(f"{c}/{s}" for c, s in sessions)
    print(f"  sessions touched (summaries written again): {len(sessions)} {names}")
    print(f"  attachments deleted: {sum(d.attachments for d in done)}")
    print(
        f"  Redis: {redis.stream_entries} inbound entries, {redis.dead_letters} dead letters, "
        f"{redis.notices} notifications, {redis.attachment_keys} attachment keys, "
        f"{redis.jobs} job records, {redis.timers} idle timers"
    )
    print(f"  export files: {len(files)}")
    for host, path in files:
        print(f"    {host}: {path}")


def delete_exports(settings: Settings) -> list[tuple[str, str]]:
    """Delete the export files this host wrote that an erase reached (only a file still as
    it was written: one changed since is left and named); returns (path, what happened)."""
    host = socket.gethostname()
    done = []
    with cli_common.pg_connect(settings) as conn:
        for path, sha in conn.execute(query("erased_exports"), {"host": host}).fetchall():
            done.append((path, _delete(Path(path), bytes(sha))))
            if done[-1][1] != "changed since it was written: left in place":
                conn.execute(query("forget_export"), {"host": host, "path": path})
        conn.commit()
    return done


def _delete(path: Path, sha: bytes) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "already gone"
    except OSError as e:
        return f"cannot be read ({e.strerror}): left in place"
    if hashlib.sha256(data).digest() != sha:
        return "changed since it was written: left in place"
    path.unlink()
    return "deleted"


def record_export(
    conn: psycopg.Connection[TupleRow], path: Path, agent: str, channel: str, session_id: str
) -> None:
    """Note a file `contextlog export` wrote, for a later erase to find."""
    params = {
        "host": socket.gethostname(),
        "path": str(path.resolve()),
        "agent": agent,
        "channel": channel,
        "session_id": session_id,
        "sha256": hashlib.sha256(path.read_bytes()).digest(),
    }
    conn.execute(query("record_export"), params)
    conn.commit()


def add_parser(sub: Any) -> None:
    """The `erase` subcommand."""
    p = sub.add_parser(
        "erase",
        help="erase a conversation, a session's messages, or a sender (see --dry-run)",
        description="Erases from the log (redacted in place), projections, search, "
        "attachments, summaries and Redis; the erase record holds the subject's hash only. "
        "A conversation: --channel; a session of it: --channel and --session; everything "
        "a sender said, and the answers to it, across the agent's conversations: --sender. "
        "Backups, replicas' WAL and files people took are beyond reach (README, Erase).",
    )
    p.add_argument("agent", help="the bot (agent) whose data to erase")
    p.add_argument("--channel", help="a conversation: erase it whole (or --session of it)")
    p.add_argument("--session", help="with --channel: erase this session's messages")
    p.add_argument("--sender", help="erase what this sender said in every conversation")
    p.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    p.add_argument("--source", default="cli", help="adapter that hears erase_done (cli)")
    p.add_argument(
        "--wait",
        type=cli_common.wait_seconds,
        default=30.0,
        metavar="SECONDS",
        help="wait this long for ingest to apply it (default 30)",
    )


COMMANDS = {"erase": cmd_erase}
