"""`contextlog` subcommands of the HTTP API: serve it, manage its keys and webhooks."""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec
from rich.table import Table

from contextlog.schema.errors import ConfigError, Refused
from contextlog.worker.api import keys
from contextlog.worker.app.config import Settings
from contextlog.worker.cli import common as cli_common
from contextlog.worker.cli.common import console, positive
from contextlog.worker.cli.extras import extra_for, install_hint
from contextlog.worker.store.migrations import migrate
from contextlog.worker.tasks import webhooks as hooks


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    """Serve the HTTP API (CONTEXTLOG_API_BIND:CONTEXTLOG_API_PORT) until SIGTERM."""
    try:  # here, not at the top: importing it is what needs the extra
        from contextlog.worker.api import server
    except ModuleNotFoundError as e:
        if extra_for(e) != "api":
            raise
        raise ConfigError(install_hint("api", e.name)) from None
    cli_common.check_servers(settings)
    server.serve(settings)
    return 0


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    """Create, list or revoke API keys."""
    with cli_common.pg_connect(settings) as conn:
        migrate(conn)
        if args.action == "create":
            try:
                token = keys.create(conn, args.name, args.agent, args.channel, _csv(args.rights))
            except ValueError as e:
                raise Refused(str(e)) from None
            print(token)
            return 0
        if args.action == "revoke":
            if not keys.revoke(conn, args.key_id):
                raise Refused(f"there is no key {args.key_id!r}")
            print(f"revoked {args.key_id}")
            return 0
        _print_keys(keys.listed(conn), args.json)
    return 0


def _print_keys(rows: list[keys.ApiKey], as_json: bool) -> None:
    if as_json:
        fields = ("key_id", "name", "agents", "channels", "rights", "created_at", "revoked_at")
        items = [{f: getattr(k, f) for f in fields} for k in rows]
        print(msgspec.json.encode(items).decode())
        return
    table = Table(title="API keys")
    for col in ("id", "name", "agents", "channels", "rights", "created", "revoked"):
        table.add_column(col, overflow="fold")
    for k in rows:
        table.add_row(
            k.key_id,
            k.name,
            ", ".join(k.agents),
            ", ".join(k.channels) if k.channels else "(all)",
            ", ".join(k.rights),
            f"{k.created_at:%Y-%m-%d %H:%M}",
            f"{k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "",
        )
    console.print(table)


def cmd_webhooks(settings: Settings, args: argparse.Namespace) -> int:
    """List webhooks and their deliveries; replay a delivery."""
    with cli_common.pg_connect(settings) as conn:
        migrate(conn)
        if args.action == "replay":
            queue = hooks.Deliveries(cli_common.queue_client(settings), settings.webhook_attempts)
            if not queue.replay(conn, args.delivery_id):
                raise Refused(f"there is no delivery {args.delivery_id!r}")
            print(f"queued {args.delivery_id} again")
            return 0
        if args.action == "deliveries":
            rows: list[Any] = hooks.deliveries(conn, args.webhook, args.status, args.limit)
            columns: tuple[str, ...] = (
                "delivery_id",
                "webhook_id",
                "kind",
                "status",
                "attempts",
                "last_status",
                "last_error",
                "created_at",
            )
        else:
            rows = hooks.listed(conn)
            columns = ("webhook_id", "url", "source", "kinds", "agents", "channels", "created_at")
    items = [{c: getattr(r, c) for c in columns} for r in rows]
    if args.json:
        print(msgspec.json.encode(items).decode())
        return 0
    table = Table(title=f"webhook {args.action}")
    for col in columns:
        table.add_column(col, overflow="fold")
    for item in items:
        table.add_row(
            *(json.dumps(v, default=str) if isinstance(v, list) else str(v) for v in item.values())
        )
    console.print(table)
    return 0


def add_parsers(sub: Any) -> None:
    """The `api`, `keys` and `webhooks` subcommands."""
    sub.add_parser("api", help="serve the HTTP API (CONTEXTLOG_API_BIND, CONTEXTLOG_API_PORT)")
    k = sub.add_parser("keys", help="create, list or revoke API keys")
    actions = k.add_subparsers(dest="action", required=True)
    c = actions.add_parser("create", help="make a key; prints it once")
    c.add_argument(
        "--agent",
        action="append",
        required=True,
        help="an agent the key reaches (repeat; '*' for every agent)",
    )
    c.add_argument("--channel", action="append", help="limit to these channels (repeat)")
    c.add_argument(
        "--rights",
        default="post,read",
        help=f"comma-separated, of {', '.join(keys.RIGHTS)} (default post,read)",
    )
    c.add_argument("--name", default="", help="what the key is for")
    ls = actions.add_parser("list", help="every key, revoked ones too")
    cli_common.add_json(ls)
    r = actions.add_parser("revoke", help="revoke a key for good")
    r.add_argument("key_id", help="the key's id (`contextlog keys list`)")
    w = sub.add_parser("webhooks", help="list webhooks and deliveries; replay a delivery")
    wa = w.add_subparsers(dest="action", required=True)
    wl = wa.add_parser("list", help="registered webhooks")
    cli_common.add_json(wl)
    d = wa.add_parser("deliveries", help="deliveries, newest first")
    d.add_argument("--webhook", help="of one webhook")
    d.add_argument(
        "--status", choices=("pending", "delivered", "failed"), help="only those in this state"
    )
    d.add_argument("--limit", type=positive, default=50, help="how many, newest first (50)")
    cli_common.add_json(d)
    rp = wa.add_parser("replay", help="send a delivery again (same webhook-id)")
    rp.add_argument("delivery_id", help="the delivery's id (`contextlog webhooks deliveries`)")


COMMANDS = {"api": cmd_api, "keys": cmd_keys, "webhooks": cmd_webhooks}
