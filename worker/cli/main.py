"""The `contextlog` command line."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import redis
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from contextlog.producers.commands import parse_duration
from contextlog.schema import codec, keys
from contextlog.schema.errors import ContextlogError, EventRejected, Unavailable, one_line
from contextlog.worker.app import bootstrap, logs, metrics
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.app.signals import Stopper
from contextlog.worker.app.status import Status, gather
from contextlog.worker.cli import acl as cli_acl
from contextlog.worker.cli import answers
from contextlog.worker.cli import api as cli_api
from contextlog.worker.cli import common as cli_common
from contextlog.worker.cli import erase as cli_erase
from contextlog.worker.cli import search as cli_search
from contextlog.worker.cli import sessions as cli_sessions
from contextlog.worker.cli.common import (
    EXIT_ERROR,
    EXIT_UNAVAILABLE,
    EXIT_UNHEALTHY,
    Parser,
    console,
    non_negative,
    positive,
)
from contextlog.worker.cli.sessions import add_metrics_options
from contextlog.worker.ingest import deadletters
from contextlog.worker.store import retention
from contextlog.worker.store.migrations import migrate
from contextlog.worker.store.rebuild import rebuild

__all__ = ["EXIT_ERROR", "EXIT_UNAVAILABLE", "EXIT_UNHEALTHY", "main", "parser"]


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    """Apply pending migrations."""
    applied = cli_common.migrated(settings)
    print("applied: " + ", ".join(applied) if applied else "database schema is up to date")
    return 0


def cmd_ingest(settings: Settings, args: argparse.Namespace) -> int:
    """Run the ingest loop until SIGTERM or SIGINT."""
    stopper = Stopper(settings.stop_grace)
    stopper.install()
    cli_common.check_servers(settings)
    metrics.serve(args.metrics_port, args.metrics_bind)
    ingest = bootstrap.build_ingest(settings, stopper.stop)
    bootstrap.tune_gc_for_batches()
    return ingest.run()


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    """Print per-shard lag, pending work, dead letters and events stored."""
    client = cli_common.redis_client(settings)
    keys.check_shards(client.get(keys.SHARDS_KEY), settings.shards)  # else: other streams
    with cli_common.pg_connect(settings) as conn:
        queue = cli_common.queue_client(settings)
        status = gather(client, conn, settings.shards, SystemClock().now(), queue)
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        _print_status(status)
    return 0 if status.healthy else EXIT_UNHEALTHY


def _print_status(status: Status) -> None:
    table = Table(title="contextlog ingest")
    for col in ("shard", "length", "lag", "pending", "oldest pending", "owner", "stored"):
        table.add_column(col, justify="right" if col != "owner" else "left")
    for s in status.shards:
        age = "-" if s.oldest_pending_age_s is None else f"{s.oldest_pending_age_s:.1f}s"
        table.add_row(
            str(s.shard),
            str(s.stream_length),
            str(s.lag),
            str(s.pending),
            age,
            s.owner or "-",
            str(s.events_stored),
        )
    console.print(table)
    reasons = ", ".join(f"{k}={v}" for k, v in sorted(status.dead_letters_by_reason.items()))
    console.print(
        f"events stored: {status.events_stored}   ingest consumers: "
        f"{status.ingest_consumers}   dead letters: {status.dead_letters}"
        + (f" ({reasons})" if reasons else "")
    )
    jobs = Table(title="contextlog jobs")
    for col in ("queue", "queued", "oldest queued", "scheduled", "overdue", "running", "failed"):
        jobs.add_column(col, justify="right" if col != "queue" else "left")
    for q in status.queues:
        age = "-" if q.oldest_queued_age_s is None else f"{q.oldest_queued_age_s:.1f}s"
        jobs.add_row(
            q.name,
            str(q.queued),
            age,
            str(q.scheduled),
            str(q.overdue),
            str(q.started),
            str(q.failed),
        )
    console.print(jobs)
    oldest = status.oldest_pending_summary_age_s
    console.print(
        f"workers: {status.workers}   scheduler: {status.scheduler or '-'}   "
        f"summaries pending: {status.summary_backlog}"
        + (f" (oldest {oldest:.0f}s)" if oldest is not None else "")
        + f"   effects waiting: {status.effects_waiting}"
    )
    for node in status.redis:
        limit = f"{node.maxmemory / (1 << 20):.1f} MiB" if node.maxmemory else "no maxmemory"
        console.print(
            f"{node.redis} {node.node}: {node.used_bytes / (1 << 20):.1f} MiB used of {limit}, "
            f"maxmemory-policy {node.policy}, {node.evicted_keys} keys evicted"
        )
    if status.search_waiting or status.search_backfill_left:
        lag = "" if status.search_lag_s is None else f" (oldest {status.search_lag_s:.1f}s)"
        console.print(
            f"search: {status.search_waiting} messages waiting for the indexer{lag}, "
            f"{status.search_backfill_left} older events still to index"
        )
    if (r := status.retention) is not None:
        state = "running" if r.finished_at is None else f"{r.started_at:%Y-%m-%d %H:%M:%S} UTC"
        console.print(
            f"retention: last step {state}: dropped {r.conversations} conversations "
            f"({r.events} events), {r.expiring} told to expire sessions; waiting: "
            f"{r.left_due} due, {r.pinned} held by a live session"
        )
    for p in status.problems:
        console.print(Text.assemble(("unhealthy:", "red"), " ", p))


# Commands whose outcome ingest publishes as a notice (done, or refused with a reason).
ANSWERED = frozenset({"save", "restore", "delete-session", "purge-sessions", "search"})


def cmd_send(settings: Settings, args: argparse.Namespace) -> int:
    """Push one message or command, as an adapter would; prints the event id, and for a
    session command waits (--wait) for ingest's answer: a refusal exits 2."""
    producer = cli_common.producer(settings)
    try:
        waits = args.verb in ANSWERED and args.wait > 0
        after = answers.stream_end(producer.redis, args.source) if waits else ""
        eid = _send(producer, args)
        print(eid, flush=True)
        if not waits:
            return 0
        notice = answers.answer(producer.redis, args.source, after, eid, args.wait)
    finally:
        producer.close()
    return answers.report(notice, args.verb, args.wait)


def _send(producer: Any, args: argparse.Namespace) -> str:
    common = {
        k: v
        for k, v in (("thread", args.thread), ("sender", args.sender), ("source", args.source))
        if v is not None
    }
    verb = args.verb
    if verb == "message":
        content: Any = _blocks(args.text) if args.blocks else args.text
        eid = producer.post_message(
            args.agent, args.channel, args.role, content, external_id=args.external_id, **common
        )
    elif verb == "clear":
        eid = producer.clear(args.agent, args.channel, **common)
    elif verb == "save":
        description = args.description or args.description_option
        eid = producer.save(args.agent, args.channel, description, **common)
    elif verb == "restore":
        eid = producer.restore(args.agent, args.channel, args.session_id, **common)
    elif verb == "delete-session":
        eid = producer.delete_session(args.agent, args.channel, args.session_id, **common)
    elif verb == "purge-sessions":
        eid = producer.purge_sessions(args.agent, args.channel, args.keep, **common)
    elif verb == "search":
        eid = producer.search(args.agent, args.channel, args.query, page=args.page, **common)
    elif verb == "retention":
        eid = producer.set_retention(
            args.agent,
            args.channel,
            keep_log_days=args.keep_log_days,
            keep_sessions_days=args.keep_sessions_days,
            **common,
        )
    else:
        eid = producer.configure(
            args.agent,
            args.channel,
            rolling_window=args.rolling_window,
            idle_timeout=args.idle_timeout,
            token_budget=args.token_budget,
            **common,
        )
    return str(eid)


def _blocks(text: str) -> Any:
    """`send message --blocks`: the content as JSON, decoded as ingest decodes."""
    try:
        return msgspec.json.decode(text.encode("utf-8", "surrogateescape"))
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise EventRejected(codec.MALFORMED, f"content is not valid JSON: {e}") from None
    except RecursionError:
        raise EventRejected(
            codec.MALFORMED, "content is not valid JSON: it nests too deeply"
        ) from None


def cmd_dead_letters(settings: Settings, args: argparse.Namespace) -> int:
    """List dead letters, newest first, with their reasons."""
    client: Any = cli_common.redis_client(settings)  # replies are bytes
    keys.check_shards(client.get(keys.SHARDS_KEY), settings.shards)
    rows = deadletters.newest(client, settings.shards, args.limit)
    items = [_dead_letter(entry_id, fields) for entry_id, fields in rows]
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    total = deadletters.count(client, settings.shards)
    table = Table(title=f"dead letters ({total} in all)")
    for col in ("id", "reason", "detail", "from", "original"):
        table.add_column(col, overflow="fold")
    for item in items:
        table.add_row(
            item["id"],
            item["reason"],
            item["detail"][:120],
            f"{item['stream']} {item['entry_id']}",
            str(item["original"])[:80],
        )
    console.print(table)
    return 0


def _dead_letter(entry_id: str, fields: dict[bytes, bytes]) -> dict[str, Any]:
    text = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
    original = {k.removeprefix("orig:"): v for k, v in text.items() if k.startswith("orig:")}
    return {
        "id": entry_id,
        "reason": text.get("reason", ""),
        "detail": text.get("detail", ""),
        "stream": text.get("stream", ""),
        "entry_id": text.get("entry_id", ""),
        "original": original,
    }


def cmd_context(settings: Settings, args: argparse.Namespace) -> int:
    """Print the context an adapter would send for a conversation."""
    reader = cli_common.reader(settings)
    try:
        ctx = reader.context(args.agent, args.channel, args.thread)
    finally:
        reader.close()
    if args.json:
        print(
            json.dumps(
                {
                    **ctx.to_anthropic(),
                    "token_estimate": ctx.token_estimate,
                    "truncated": ctx.truncated,
                    "window_start": ctx.window_start.isoformat() if ctx.window_start else None,
                },
                indent=2,
                ensure_ascii=False,
            )
        )
        return 0
    console.print(
        f"window since {ctx.window_start:%Y-%m-%d %H:%M:%S} UTC, "
        f"~{ctx.token_estimate} tokens" + (" (truncated to budget)" if ctx.truncated else "")
    )
    if ctx.system:
        console.print(Text.assemble(("system:", "dim"), " ", ctx.system))
    for m in ctx.messages:
        for block in m["content"]:
            console.print(Text.assemble((f"{m['role']:>9}", "bold"), " ", _block_text(block)))
    return 0


def _block_text(block: dict[str, Any]) -> str:
    if block["type"] == "text":
        return str(block["text"])
    if block["type"] == "tool_use":
        return f"[tool_use {block['id']} {block['name']}({json.dumps(block['input'])})]"
    if block["type"] == "tool_result":
        content = block.get("content", "")
        inner = content if isinstance(content, str) else " ".join(b["text"] for b in content)
        return f"[tool_result {block['tool_use_id']}: {inner}]"
    return json.dumps(block, ensure_ascii=False)


def cmd_rebuild(settings: Settings, args: argparse.Namespace) -> int:
    """Truncate the projections and replay the log, with a progress bar."""
    cli_common.migrated(settings)
    with cli_common.pg_connect(settings) as conn, Progress(console=console) as bar:
        task = bar.add_task("replaying events", total=None)
        done = rebuild(
            conn,
            lambda n, total: bar.update(task, completed=n, total=total),
            defaults=settings.conversation,
        )
    console.print(f"rebuilt conversations and threads from {done} events")
    return 0


def cmd_retire(settings: Settings, args: argparse.Namespace) -> int:
    """Archive and drop silent conversations, or put an archive back (then rebuild)."""
    with cli_common.pg_connect(settings) as conn:
        migrate(conn)
        if args.restore is not None:
            n = retention.restore(conn, Path(args.restore))
            console.print(f"restored {n} events from {args.restore}; rebuilding the projections")
            return cmd_rebuild(settings, args)
        if args.idle_for is None or args.archive is None:
            return _fail(EXIT_ERROR, "retire: give --idle-for and --archive (or --restore FILE)")
        done = retention.retire(
            conn,
            Path(args.archive),
            now=SystemClock().now(),
            idle_for=dt.timedelta(seconds=args.idle_for),
            limit=args.limit,
        )
    for agent, channel in done.referenced:
        console.print(f"kept {agent}/{channel}: a live session references its events")
    where = f" into {done.archive}" if done.conversations else ""
    console.print(f"retired {len(done.conversations)} conversations, {done.events} events{where}")
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    """Run the scripted demo."""
    from contextlog.worker.dev.demo import run

    result: int = run(settings, Console())  # the demo's own text uses markup
    return result


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _send_parser(sub: Any) -> None:
    send = sub.add_parser("send", help="push a message or a command from the shell")
    verbs = send.add_subparsers(dest="verb", required=True)

    def verb(name: str, help: str, *extra: tuple[str, str]) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = verbs.add_parser(name, help=help)
        cli_common.add_conversation(p)
        for arg, what in extra:
            p.add_argument(arg, help=what)
        p.add_argument("--thread", help="the thread inside the conversation (default: none)")
        p.add_argument("--sender", help="who sent it, as the platform names them")
        p.add_argument("--source", default="cli", help="adapter that gets the notifications")
        return p

    m = verb("message", "post a message", ("text", "the message (or --blocks JSON)"))
    m.add_argument("--role", choices=("user", "assistant"), default="user", help="who speaks")
    m.add_argument("--external-id", help="the platform's message id: a re-send is stored once")
    m.add_argument("--blocks", action="store_true", help="TEXT is a JSON list of content blocks")
    verb("clear", "/context clear")
    save = verb("save", "/context save [description]")
    described = save.add_mutually_exclusive_group()
    described.add_argument("description", nargs="?", help="what the session was about")
    described.add_argument(
        "--description", dest="description_option", metavar="TEXT", help="the same, as an option"
    )
    purge = verb("purge-sessions", "keep only the newest N sessions")
    purge.add_argument("--keep", type=non_negative, required=True, help="sessions to keep (N)")
    found = verb("search", "/context search QUERY: this conversation's matches, as a notice")
    found.add_argument("query", help="what to look for (`contextlog search --help`: syntax)")
    found.add_argument("--page", type=positive, default=1, help="page N of the matches")
    session = ("session_id", "a saved session's id (`contextlog sessions`), or `last`")
    for answered in (
        save,
        verb("restore", "/context restore", session),
        verb("delete-session", "delete one saved session", session),
        purge,
        found,
    ):
        cli_common.add_wait(answered)
    r = verb("retention", "this conversation's retention, over its agent's policy")
    r.add_argument(
        "--keep-log-days",
        type=non_negative,
        help="keep its log N days after its last activity (0: its agent's policy)",
    )
    r.add_argument(
        "--keep-sessions-days",
        type=non_negative,
        help="keep its saved sessions N days (0: its agent's policy)",
    )
    c = verb("configure", "change conversation settings")
    c.add_argument("--rolling-window", type=_duration, help="history kept in context (e.g. 24h)")
    c.add_argument("--idle-timeout", type=_duration, help="silence before an auto-save (30m; 0)")
    c.add_argument("--token-budget", type=positive, help="tokens a context may hold (e.g. 16000)")


def parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = Parser(prog="contextlog", description="conversation memory for LLM agents")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="create or update the database schema")
    ingest = sub.add_parser("ingest", help="move events from the Redis streams into Postgres")
    add_metrics_options(ingest)
    st = sub.add_parser("status", help="lag, pending work, dead letters, events stored")
    cli_common.add_json(st)
    _send_parser(sub)
    dl = sub.add_parser("dead-letters", help="list rejected entries with their reasons")
    dl.add_argument("--limit", type=positive, default=20, help="how many, newest first (20)")
    cli_common.add_json(dl)
    ctx = sub.add_parser("context", help="show the context of a conversation")
    cli_common.add_conversation(ctx)
    ctx.add_argument("--thread", help="the thread inside the conversation (default: none)")
    cli_common.add_json(ctx)
    sub.add_parser("rebuild", help="rebuild the projections by replaying the log")
    sub.add_parser("demo", help="run a short scripted conversation end to end")
    ret = sub.add_parser("retire", help="archive, then drop, conversations silent for long")
    ret.add_argument("--idle-for", type=_duration, help="silent for at least (e.g. 90d)")
    ret.add_argument("--archive", help="directory the archive file is written to")
    ret.add_argument("--limit", type=positive, default=1000, help="conversations per run")
    ret.add_argument("--restore", metavar="FILE", help="put an archive back, then rebuild")
    cli_sessions.add_parsers(sub)
    cli_api.add_parsers(sub)
    cli_acl.add_parsers(sub)
    cli_search.add_parser(sub)
    cli_erase.add_parser(sub)
    return p


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "migrate": cmd_migrate,
    "ingest": cmd_ingest,
    "status": cmd_status,
    "send": cmd_send,
    "dead-letters": cmd_dead_letters,
    "demo": cmd_demo,
    "context": cmd_context,
    "rebuild": cmd_rebuild,
    "retire": cmd_retire,
    **cli_sessions.COMMANDS,
    **cli_api.COMMANDS,
    **cli_acl.COMMANDS,
    **cli_search.COMMANDS,
    **cli_erase.COMMANDS,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `contextlog` console script: 0 done, 1 unhealthy (status),
    2 bad input or configuration, 3 Postgres or Redis unreachable. No traceback."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed on one line
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    try:
        settings = Settings.from_env()
        logs.configure(settings.log_level, settings.log_format, settings.log_timestamps)
        return COMMANDS[args.command](settings, args)
    except KeyboardInterrupt:
        return 130
    except Unavailable as e:
        return _fail(EXIT_UNAVAILABLE, str(e))
    except ContextlogError as e:
        return _fail(EXIT_ERROR, str(e))
    except psycopg.OperationalError as e:
        return _fail(EXIT_UNAVAILABLE, f"cannot reach Postgres (DATABASE_URL): {e}")
    except psycopg.errors.UndefinedTable as e:
        return _fail(
            EXIT_ERROR,
            f"the database at DATABASE_URL has no contextlog schema ({e}): "
            "run `contextlog migrate`",
        )
    except psycopg.Error as e:
        return _fail(EXIT_ERROR, f"Postgres refused the request (DATABASE_URL): {e}")
    except (redis.ConnectionError, redis.TimeoutError) as e:
        return _fail(EXIT_UNAVAILABLE, f"cannot reach Redis (REDIS_URL): {e}")
    except redis.RedisError as e:
        return _fail(EXIT_ERROR, f"Redis refused the request (REDIS_URL): {e}")


def _fail(code: int, message: str) -> int:
    print(f"contextlog: {one_line(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
