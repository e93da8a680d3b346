"""`contextlog search`: an agent's log searched from the shell (`ContextReader.search`)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

import msgspec
from rich.text import Text

from contextlog.producers import search as found
from contextlog.schema.defaults import parse_duration
from contextlog.worker.app.clock import SystemClock
from contextlog.worker.app.config import Settings
from contextlog.worker.cli import common as cli_common
from contextlog.worker.cli.common import console, positive


def when(text: str) -> dt.datetime:
    """`--since`/`--until`: an ISO date or time (UTC unless it says), or a duration ago."""
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            return SystemClock().now() - dt.timedelta(seconds=parse_duration(text))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a time: {text!r} (an ISO date such as 2026-11-22, or a duration ago: 7d)"
            ) from None
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def cmd_search(settings: Settings, args: argparse.Namespace) -> int:
    """Print one page of an agent's matches, best first."""
    reader = cli_common.reader(settings)
    try:
        page = reader.search(
            args.agent,
            args.query,
            channel=args.channel,
            thread=args.thread,
            sender=args.sender,
            since=args.since,
            until=args.until,
            page=args.page,
            per_page=args.per_page,
        )
    finally:
        reader.close()
    if args.json:
        print(msgspec.json.encode(_json(page)).decode())
        return 0
    more = "+" if page.capped else ""
    console.print(
        f"{page.total}{more} matches of {args.query!r} in {args.agent}'s log, page "
        f"{page.page} of {page.pages}"
        + (f"; the next: --page {page.page + 1}" if page.page < page.pages else "")
    )
    for hit in page:
        console.print(_head(hit), no_wrap=True, overflow="ellipsis")
        console.print(Text("    " + hit.snippet))
    return 0


def _head(hit: found.SearchHit) -> Text:
    head = Text(f"{hit.at:%Y-%m-%d %H:%M}  ", style="dim")
    head.append(f"{hit.channel}#{hit.seq}", style="bold")
    if hit.thread:
        head.append(f" thread {hit.thread}")
    head.append(f"  {hit.sender or hit.role}")
    if hit.sessions:
        head.append(f"  sessions: {', '.join(hit.sessions)}")
    return head


def _json(page: found.SearchPage) -> dict[str, Any]:
    return {
        "query": page.query,
        "page": page.page,
        "pages": page.pages,
        "total": page.total,
        "capped": page.capped,
        "hits": page.hits,
    }


def add_parser(sub: Any) -> None:
    """The `search` subcommand."""
    s = sub.add_parser(
        "search",
        help='search an agent\'s log (words, "phrases", prefix*, -excluded, a OR b)',
        description='Words must all appear; "a phrase" in order; roll* by prefix; -word '
        "leaves out; a OR b either. Case and accents are ignored. Searches the whole log, "
        "outside the window and in deleted sessions too.",
    )
    s.add_argument("agent", help="the bot (agent) whose log to search")
    s.add_argument("query", help="what to look for: quote it; one that starts with - after --")
    s.add_argument("--channel", help="only this channel's messages")
    s.add_argument("--thread", help="only this thread's messages")
    s.add_argument("--sender", help="only what this sender said")
    s.add_argument("--since", type=when, help="logged at or after (ISO time, or 7d ago)")
    s.add_argument("--until", type=when, help="logged before (ISO time, or 1d ago)")
    s.add_argument("--page", type=positive, default=1, help="page N (1: the best matches)")
    s.add_argument("--per-page", type=positive, default=found.PER_PAGE, help="matches a page (10)")
    cli_common.add_json(s)


COMMANDS = {"search": cmd_search}
