"""`contextlog acl`: the Redis users of each role (worker/app/acl.py), printed for redis-cli
or an ACL file. Passwords come from CONTEXTLOG_REDIS_PASSWORD_<ROLE> and only their
SHA-256 is printed (as Redis keeps them); a user whose variable is unset is printed `off`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from contextlog.schema.errors import ConfigError
from contextlog.schema.queries import query
from contextlog.worker.app import acl
from contextlog.worker.app.config import Settings

FORMATS = ("setuser", "file")


def cmd_acl(settings: Settings, args: argparse.Namespace) -> int:
    """Print one line per user: `ACL SETUSER ...` or an ACL file's `user ...`; with
    --postgres, the SQL of the Postgres role of adapters' readers instead."""
    if args.postgres:
        print(query("reader_role") + ";")
        return 0
    try:
        chosen = acl.roles(args.roles, args.source)
        users = acl.users(chosen, args.user_prefix, args.redis_version, settings.redis_passwords)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for u in users:
        print(u.setuser() if args.format == "setuser" else u.file_line())
    if not args.roles and not args.source:
        _note("no --source: no adapter user printed (one per adapter: --source NAME)")
    for u in users:
        if "off" in u.rules:
            _note(f"{u.role.password_var} is not set: {u.name} is printed `off` (no login)")
    return 0


def _note(text: str) -> None:
    """A remark on stderr: stdout holds only the lines for redis-cli or the ACL file."""
    print(f"contextlog acl: note: {text}", file=sys.stderr)


def _checked(check: Any) -> Any:
    def parse(text: str) -> Any:
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def add_parsers(sub: Any) -> None:
    """The `acl` subcommand."""
    p = sub.add_parser(
        "acl",
        help="print the Redis ACL users of each role (Redis 7+), e.g. `| redis-cli`",
        description="One Redis user per role: adapters (one per --source), ingest, worker, "
        "dashboard, api; each allowed only the commands and keys its process uses. "
        "Passwords: set CONTEXTLOG_REDIS_PASSWORD_<ROLE> (INGEST, WORKER, DASHBOARD, API, "
        "ADAPTER_<SOURCE>); only their SHA-256 is printed, and a user without one is `off`.",
    )
    p.add_argument(
        "roles",
        nargs="*",
        type=_checked(acl.check_role),
        metavar="ROLE",
        help=f"roles to print, of {', '.join(acl.NAMES)} (default: all)",
    )
    p.add_argument(
        "--source",
        action="append",
        default=[],
        type=_checked(acl.check_source),
        help="an adapter's source (its notification stream); repeat for each adapter",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="setuser",
        help="`setuser`: ACL SETUSER commands for redis-cli; `file`: lines of an ACL file",
    )
    p.add_argument(
        "--user-prefix",
        default="contextlog-",
        type=_checked(acl.check_prefix),
        help="prefix of the user names (default contextlog-: contextlog-ingest ...)",
    )
    p.add_argument(
        "--redis-version",
        default=acl.OLDEST,
        type=_checked(acl.parse_version),
        metavar="X.Y",
        help="the Redis the rules are for (default 7.0; 7.2 or newer also allows "
        "CLIENT SETINFO, which redis-py sends on connect); older than 7.0 is refused",
    )
    p.add_argument(
        "--postgres",
        action="store_true",
        help="print instead the SQL of contextlog_reader, a Postgres role for adapters' "
        'readers without the signing key (e.g. `| psql "$DATABASE_URL"`)',
    )


COMMANDS = {"acl": cmd_acl}
