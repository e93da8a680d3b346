"""`contextlog` subcommands for saved sessions, notifications and the RQ worker."""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
from rich.table import Table

from contextlog.producers.notifications import Notifications
from contextlog.schema.errors import ConfigError
from contextlog.schema.notices import Notice
from contextlog.worker.app import bootstrap, metrics
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.app.signals import Stopper
from contextlog.worker.cli import common as cli_common
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
    table = Table(title=f"sessions of {where}, page {page.page} of {page.pages}")
    # Without --channel the list spans channels: show each one, as export needs it.
    columns = ["id", "saved", "messages", "auto", "description", "summary"]
    if not args.channel:
        columns.insert(1, "channel")
    for col in columns:
        table.add_column(col, overflow="fold")
    for s in page:
        cells = [
            s.session_id,
            f"{s.created_at:%Y-%m-%d %H:%M}",
            str(s.message_count),
            "auto" if s.auto else "",
            s.description or s.preview,
            "(pending)" if s.summary is None else s.summary,
        ]
        if not args.channel:
            cells.insert(1, s.channel)
        table.add_row(*cells)
    console.print(table)
    return 0


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
        archive.document(info, messages), archive.target(Path.cwd(), info.session_id, output)
    )
    print(path)
    return 0


def cmd_import(settings: Settings, args: argparse.Namespace) -> int:
    """Validate an export file and create a session from it in a conversation."""
    doc = archive.read(Path(args.file))
    producer = cli_common.producer(settings)
    try:
        evts = archive.events(doc, args.agent, args.channel, SystemClock().now(), args.source)
        print(archive.push(producer, evts))
    finally:
        producer.close()
    return 0


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
    """Run an RQ worker on the `summaries` and `idle` queues (with RQ's scheduler)."""
    stopper = Stopper(settings.stop_grace)
    stopper.install()  # RQ installs its own in its loop, which tell the stopper first
    bootstrap.check_worker_redis(settings)
    bootstrap.run_migrations(settings)
    metrics.serve(args.metrics_port, args.metrics_bind)
    bootstrap.install(bootstrap.build_resources(settings))
    sweeper = threading.Thread(
        target=bootstrap.sweep_forever, args=(settings, stopper.stop), name="sweeper", daemon=True
    )
    sweeper.start()
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
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def dashboard_argv(settings: Settings) -> list[str]:
    """rq-dashboard's arguments: bound to loopback unless told otherwise, and never
    exposed beyond it without basic auth. Credentials go by environment, not argv."""
    exposed = settings.dashboard_bind not in LOOPBACK
    if exposed and not (settings.dashboard_user and settings.dashboard_password):
        raise ConfigError(
            f"CONTEXTLOG_DASHBOARD_BIND={settings.dashboard_bind} exposes the dashboard: set "
            "CONTEXTLOG_DASHBOARD_USER and CONTEXTLOG_DASHBOARD_PASSWORD for basic auth"
        )
    return [
        "--bind",
        settings.dashboard_bind,
        "--port",
        str(settings.dashboard_port),
        "--redis-url",
        settings.queue_redis_url,
    ]


def cmd_dashboard(settings: Settings, args: argparse.Namespace) -> int:
    """Run rq-dashboard on the queue Redis (queues `idle` and `summaries`)."""
    import rq_dashboard.cli  # type: ignore[import-untyped]  # no stubs

    if settings.dashboard_user and settings.dashboard_password:
        os.environ["RQ_DASHBOARD_USERNAME"] = settings.dashboard_user
        os.environ["RQ_DASHBOARD_PASSWORD"] = settings.dashboard_password
    rq_dashboard.cli.run(
        args=dashboard_argv(settings),
        prog_name="contextlog dashboard",
        auto_envvar_prefix="RQ_DASHBOARD",
    )
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
    s.add_argument("agent")
    s.add_argument("--channel")
    s.add_argument("--page", type=positive, default=1)
    s.add_argument("--json", action="store_true")
    e = sub.add_parser(
        "export",
        help="write a saved session as a JSON file",
        description="A session id is unique only within its conversation (agent and "
        "channel): name both; `contextlog sessions AGENT` lists them.",
    )
    e.add_argument("session_id")
    e.add_argument("--agent", required=True, help="the conversation's agent")
    e.add_argument("--channel", required=True, help="the conversation's channel")
    e.add_argument("-o", "--output", help="file to write (default: <id>.json here)")
    i = sub.add_parser("import", help="create a session from an exported JSON file")
    i.add_argument("file")
    i.add_argument("--agent", required=True)
    i.add_argument("--channel", required=True)
    i.add_argument("--source", default="cli", help="adapter told when it is done")
    n = sub.add_parser("notifications", help="print an adapter's notifications")
    n.add_argument("source", nargs="?", default="cli")
    n.add_argument("--group", default="cli")
    n.add_argument("--follow", "-f", action="store_true")
    n.add_argument("--json", action="store_true")
    c = sub.add_parser("chat", help="chat in the terminal, with memory")
    c.add_argument("agent")
    c.add_argument("--channel", default="terminal")
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
    "dashboard": cmd_dashboard,
    "chat": cmd_chat,
}
