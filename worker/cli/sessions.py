"""`contextlog` subcommands for saved sessions, notifications and the RQ worker."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

import msgspec
from rich.text import Text

from contextlog.producers.history import SessionInfo
from contextlog.producers.notifications import Notifications
from contextlog.schema.notices import Notice
from contextlog.worker.app import bootstrap, metrics
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.app.signals import Stopper
from contextlog.worker.cli import answers, dashboard
from contextlog.worker.cli import common as cli_common
from contextlog.worker.cli import erase as cli_erase
from contextlog.worker.cli.common import console, positive
from contextlog.worker.store import archive
from contextlog.worker.tasks.rqworker import run_until_stopped


def cmd_sessions(settings: Settings, args: argparse.Namespace) -> int:
    """List saved sessions, newest first, ten a page."""
    reader = cli_common.reader(settings)
    try:
        page = reader.sessions(args.agent, args.channel, page=args.page)
    finally:
        reader.close()
    if args.json:
        print(msgspec.json.encode(page.sessions).decode())
        return 0
    where = f"{args.agent}/{args.channel}" if args.channel else args.agent
    console.print(
        f"sessions of {where}, page {page.page} of {page.pages} ({page.total} saved)"
        + (f"; the next: --page {page.page + 1}" if page.page < page.pages else "")
    )
    for line, about in session_lines(list(page), with_channel=not args.channel):
        # The first line whole (an id to copy for restore/export), the second cut to the
        # width: the whole summary is in `--json`.
        console.print(line, no_wrap=True, overflow="ignore", crop=False)
        console.print(about, no_wrap=True, overflow="ellipsis")
    return 0


def session_lines(sessions: list[SessionInfo], *, with_channel: bool) -> list[tuple[Text, Text]]:
    """Two lines a session: its id (and channel, across channels), when, how many messages,
    auto; then its description or first message, and its summary."""
    width = max((len(s.session_id) for s in sessions), default=0)
    lines = []
    for s in sessions:
        head = Text(s.session_id.ljust(width), style="bold")
        if with_channel:
            head.append(f"  {s.channel}")
        msgs = "msg" if s.message_count == 1 else "msgs"
        head.append(f"  {s.created_at:%Y-%m-%d %H:%M}  {s.message_count} {msgs}")
        if s.auto:
            head.append("  auto")
        summary = "(summary pending)" if s.summary is None else s.summary
        about = Text(f"    {' '.join((s.description or s.preview).split())}: ")
        about.append(" ".join(summary.split()), style="dim")
        lines.append((head, about))
    return lines


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    """Write a session of one conversation as JSON; the default file name comes from
    the sanitised id."""
    reader = cli_common.reader(settings)
    try:
        info, messages = archive.load(reader, args.session_id, args.agent, args.channel)
    finally:
        reader.close()
    output = Path(args.output) if args.output else None
    path = archive.write(
        archive.document(info, messages),
        archive.target(Path.cwd(), info.session_id, output),
        overwrite=args.force,
    )
    # Recorded, so that an erase that reaches the session deletes the file here.
    with cli_common.pg_connect(settings) as conn:
        cli_erase.record_export(conn, path, info.agent, info.channel, info.session_id)
    print(path)
    return 0


def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    """Validate an export file and create a session from it in a conversation; says
    which session it became (ingest keeps the exported id where it is free)."""
    doc = archive.read(Path(args.file))
    producer = cli_common.producer(settings)
    try:
        evts = archive.events(doc, args.agent, args.channel, SystemClock().now(), args.source)
        after = answers.stream_end(producer.redis, args.source)
        eid = archive.push(producer, evts)
        print(
            f"sent session {doc.session_id} ({len(doc.messages)} messages) to "
            f"{args.agent}/{args.channel} as event {eid}",
            flush=True,
        )
        notice = answers.answer(producer.redis, args.source, after, eid, args.wait)
    finally:
        producer.close()
    return answers.report(notice, "import", args.wait)


def _notice_line(n: Notice) -> str:
    what = f"[{n.kind}] {n.agent}/{n.channel}"
    if n.session_id:
        what += f" {n.session_id}"
    return what + (f": {n.text}" if n.text else "")


def cmd_notifications(settings: Settings, args: argparse.Namespace) -> int:
    """Print an adapter's notifications (acknowledging them), or follow them."""
    client = cli_common.redis_client(settings)
    cli_common.check_redis(client)
    reader = Notifications(client, args.source, group=args.group)
    try:
        while True:
            batch = reader.read(count=100, block_ms=1000 if args.follow else None)
            for n in batch:
                if args.json:
                    print(msgspec.json.encode(n).decode(), flush=True)
                else:
                    print(_notice_line(n), flush=True)
            reader.ack(batch)
            if not batch and not args.follow:
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        reader.close()


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    """Run an RQ worker on the `summaries`, `idle` and `webhooks` queues (with RQ's
    scheduler), the sweeper and the webhook dispatcher."""
    stopper = Stopper(settings.stop_grace)
    stopper.install()  # RQ installs its own in its loop, which tell the stopper first
    cli_common.check_servers(settings, queue=True)
    bootstrap.check_worker_redis(settings)
    metrics.serve(args.metrics_port, args.metrics_bind)
    bootstrap.install(bootstrap.build_resources(settings))
    sweeper = threading.Thread(
        target=bootstrap.sweep_forever, args=(settings, stopper.stop), name="sweeper", daemon=True
    )
    indexer = threading.Thread(
        target=bootstrap.index_forever, args=(settings, stopper.stop), name="indexer", daemon=True
    )
    sweeper.start()
    dispatcher = threading.Thread(
        target=bootstrap.dispatch_webhooks_forever,
        args=(settings, stopper.stop),
        name="webhooks",
        daemon=True,
    )
    dispatcher.start()
    indexer.start()
    try:
        run_until_stopped(
            lambda: bootstrap.build_worker(settings, stopper.request),
            stopper.stop,
            backoff_max=settings.backoff_max,
            logging_level=settings.log_level.upper(),
            burst=args.burst,
            after=stopper.install,
        )
    finally:
        stopper.stop.set()
        sweeper.join(timeout=5)  # it clears its heartbeat on a clean stop
        dispatcher.join(timeout=5)
        indexer.join(timeout=5)
    return 0


def cmd_chat(settings: Settings, args: argparse.Namespace) -> int:
    """A terminal chat client on `producers`: messages, /context commands, notifications."""
    from contextlog.worker.dev import chat

    return chat.run(settings, args.agent, args.channel)


def add_metrics_options(p: argparse.ArgumentParser) -> None:
    """`--metrics-port` (Prometheus /metrics) and where it listens."""
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--metrics-bind", default="127.0.0.1", help="address for --metrics-port")


def add_parsers(sub: Any) -> None:
    """The session, notification and worker subcommands."""
    s = sub.add_parser("sessions", help="list saved sessions, newest first")
    s.add_argument("agent", help="the bot (agent) whose sessions to list")
    s.add_argument("--channel", help="only this channel's (default: every channel)")
    s.add_argument("--page", type=positive, default=1, help="page N, ten a page (1: newest)")
    cli_common.add_json(s)
    e = sub.add_parser(
        "export",
        help="write a saved session as a JSON file",
        description="A session id is unique only within its conversation (agent and "
        "channel): name both; `contextlog sessions AGENT` lists them.",
    )
    e.add_argument("session_id", help="the session's id (`contextlog sessions AGENT`)")
    e.add_argument("--agent", required=True, help="the conversation's agent")
    e.add_argument("--channel", required=True, help="the conversation's channel")
    e.add_argument("-o", "--output", help="file to write (default: <id>.json here)")
    e.add_argument("--force", action="store_true", help="overwrite the file if it exists")
    i = sub.add_parser("import", help="create a session from an exported JSON file")
    i.add_argument("file", help="a file `contextlog export` wrote")
    i.add_argument("--agent", required=True, help="the agent of the conversation to import into")
    i.add_argument("--channel", required=True, help="its channel")
    i.add_argument("--source", default="cli", help="adapter told when it is done")
    cli_common.add_wait(i)
    n = sub.add_parser("notifications", help="print an adapter's notifications")
    n.add_argument("source", nargs="?", default="cli", help="the adapter's name (default: cli)")
    n.add_argument("--group", default="cli", help="consumer group that acknowledges them (cli)")
    n.add_argument("--follow", "-f", action="store_true", help="keep printing new ones")
    cli_common.add_json(n)
    c = sub.add_parser("chat", help="chat in the terminal, with memory")
    c.add_argument("agent", help="the bot (agent) to chat as")
    c.add_argument("--channel", default="terminal", help="the channel (default: terminal)")
    sub.add_parser("dashboard", help="run rq-dashboard (127.0.0.1:9181 unless configured)")
    w = sub.add_parser("worker", help="run jobs: summaries, compaction, idle saves")
    w.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    add_metrics_options(w)


COMMANDS = {
    "sessions": cmd_sessions,
    "export": cmd_export,
    "import": cmd_import,
    "notifications": cmd_notifications,
    "worker": cmd_worker,
    "dashboard": dashboard.cmd_dashboard,
    "chat": cmd_chat,
}
