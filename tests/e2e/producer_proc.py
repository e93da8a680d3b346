"""A producer process for the end-to-end tests: pushes numbered messages, records their ids.

Run as `python -m tests.e2e.producer_proc --index 0 --events 12500 --out ids-0.txt`.
Producer `i` owns conversations ("e2e", f"p{i}-c{j}"); its k-th event goes to conversation
k % conversations with the per-conversation counter k // conversations, and its content is
f"p{i}-c{j}#{counter}", so a reader can check both identity and order. After each batch is
pushed, one line "channel counter event_id" per event is appended to `--out`, so the file
lists exactly what reached Redis, in push order.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from contextlog.producers import Producer

AGENT = "e2e"


def channel(producer: int, conversation: int) -> str:
    """The channel of one conversation of one producer."""
    return f"p{producer}-c{conversation}"


def content(channel_name: str, counter: int) -> str:
    """The text of a conversation's `counter`-th message."""
    return f"{channel_name}#{counter}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--conversations", type=int, default=25)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--pause", type=float, default=0.04, help="seconds between batches")
    p.add_argument("--out", required=True)
    return p


def run(args: argparse.Namespace) -> int:
    """Push `--events` messages in batches, appending their ids to `--out` as they go."""
    producer = Producer.from_url(args.redis_url, shards=args.shards)
    try:
        with open(args.out, "w", encoding="utf-8") as out:
            for start in range(0, args.events, args.batch):
                lines = []
                with producer.batch() as b:
                    for k in range(start, min(start + args.batch, args.events)):
                        name = channel(args.index, k % args.conversations)
                        counter = k // args.conversations
                        role = "user" if counter % 2 == 0 else "assistant"
                        eid = b.post_message(AGENT, name, role, content(name, counter))
                        lines.append(f"{name} {counter} {eid}\n")
                # The batch is in Redis now (the `with` block sent it): record it.
                out.writelines(lines)
                out.flush()
                time.sleep(args.pause)
    finally:
        producer.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m tests.e2e.producer_proc`."""
    return run(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
