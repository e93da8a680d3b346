"""What ingest answered to a command the CLI sent: the notice it published about that
command on the source's notification stream (`contextlog:out:{source}`), or None.

The stream is read from where it ended before the command was sent, without a consumer
group, so nothing is acknowledged or taken from the adapters and `contextlog
notifications` that read it through their groups."""

from __future__ import annotations

import sys
import time
from typing import Any, Final

from contextlog.schema import keys
from contextlog.schema import notices as nt
from contextlog.schema.errors import EventRejected, one_line
from contextlog.worker.cli.common import EXIT_ERROR

BLOCK_MS: Final = 500  # one read's wait: below the CLI's 2 s reply timeout
START: Final = "0-0"


def stream_end(client: Any, source: str) -> str:
    """The id of the last entry on `source`'s stream: the answer comes after it."""
    last = client.xrevrange(keys.outbox(source), count=1)
    return _text(last[0][0]) if last else START


def answer(client: Any, source: str, after: str, event_id: str, seconds: float) -> nt.Notice | None:
    """The notice about `event_id` published after entry `after`, waiting up to `seconds`
    (0: not at all); None if there is none by then."""
    return answers(client, source, after, [event_id], seconds).get(event_id)


def answers(
    client: Any, source: str, after: str, event_ids: list[str], seconds: float
) -> dict[str, nt.Notice]:
    """The notices about each of `event_ids` published after entry `after`, by event id,
    waiting up to `seconds` for all of them (those not answered by then are missing)."""
    deadline = time.monotonic() + seconds
    stream = keys.outbox(source)
    wanted, got = set(event_ids), dict[str, nt.Notice]()
    while wanted - got.keys() and (left := deadline - time.monotonic()) > 0:
        block = max(1, min(BLOCK_MS, int(left * 1000)))
        for _, entries in client.xread({stream: after}, count=100, block=block) or []:
            for entry_id, fields in entries:
                after = _text(entry_id)
                found = _notice(fields)
                if found is not None and found.event_id in wanted:
                    got.setdefault(found.event_id, found)
    return got


def report(notice: nt.Notice | None, what: str, waited: float) -> int:
    """Print ingest's answer to a command (the exit code): done, refused (2, one line on
    stderr), or no answer in time (a note: the command was sent all the same)."""
    if notice is None:
        print(
            f"contextlog: note: sent, but ingest has not answered within {waited:g} s;"
            " is it running? (`contextlog status`)",
            file=sys.stderr,
        )
        return 0
    if notice.kind == nt.COMMAND_REFUSED:
        print(f"contextlog: {what} refused: {one_line(notice.text or '')}", file=sys.stderr)
        return EXIT_ERROR
    print(notice.text or notice.kind)
    return 0


def _notice(fields: dict[Any, Any]) -> nt.Notice | None:
    data = fields.get(nt.ENTRY_FIELD.encode(), fields.get(nt.ENTRY_FIELD))
    if data is None:
        return None
    try:
        return nt.decode(data if isinstance(data, bytes) else data.encode())
    except EventRejected:  # not a notice this version reads: not ours to answer
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
