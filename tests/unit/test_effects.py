"""The effects outbox's typed union: what is kept in Postgres comes back as it was."""

from __future__ import annotations

import datetime as dt
import json

from contextlog.schema import notices as nt
from contextlog.schema.notices import Notice
from contextlog.worker.app.clock import FakeClock
from contextlog.worker.effects import kinds as fx
from contextlog.worker.effects.relay import Relay

DUE = dt.datetime(2026, 11, 22, 12, 30, tzinfo=dt.UTC)


def test_every_effect_round_trips_through_the_outbox_rows() -> None:
    every: list[fx.Effect] = [
        fx.Notice("discord", '{"kind":"session_saved"}'),
        fx.Summarize("alpha", "general", "2026-11-22_notes"),
        fx.Compact("alpha", "general"),
        fx.Arm("alpha", "general", DUE),
    ]
    rows = json.loads(fx.to_rows(every))
    assert [r["kind"] for r in rows] == ["notice", "summarize", "compact", "arm"]
    assert all("type" not in r["body"] for r in rows)
    back = [fx.from_row(r["kind"], r["body"]) for r in rows]
    assert back[:3] == every[:3]
    assert isinstance(back[3], fx.Arm) and back[3].due == DUE


def test_rows_kept_before_the_union_still_decode() -> None:
    """Rows an older ingest left in `effects` had this shape: same kind, same body."""
    old = fx.from_row("summarize", {"agent": "a", "channel": "c", "session_id": "s"})
    assert old == fx.Summarize("a", "c", "s")


def test_only_notices_and_summaries_are_kept() -> None:
    mixed: list[fx.Effect] = [fx.Compact("a", "c"), fx.Notice("slack", "{}"), fx.Arm("a", "c", DUE)]
    assert fx.durable(mixed) == [fx.Notice("slack", "{}")]


class Recorder:
    """Jobs, timers and notifier in one: records the order the relay reaches them."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def summarize(self, agent: str, channel: str, session_id: str, round: int = 0) -> bool:
        self.order.append(f"summarize {session_id}")
        return True

    def compact_many(self, convs: list[tuple[str, str]]) -> int:
        self.order.append("compact")
        return len(convs)

    def arm_many(self, arms: list[tuple[str, str, dt.datetime]], now: dt.datetime) -> None:
        self.order.append("arm")

    def publish(self, notices: list[tuple[str, Notice]]) -> None:
        self.order += [f"notice {n.kind}" for _, n in notices]


def test_a_notice_is_sent_after_the_jobs_it_announces_are_queued() -> None:
    """An adapter hearing `session_saved` may at once run or wait for the summary job."""
    saved = nt.Notice(
        notice_id="n1", kind=nt.SESSION_SAVED, agent="a", channel="c", occurred_at=DUE
    )
    rec = Recorder()
    relay = Relay(rec, rec, rec, FakeClock(DUE))  # type: ignore[arg-type]
    relay.send(
        [
            fx.Notice("bot", nt.encode(saved).decode()),
            fx.Summarize("a", "c", "s"),
            fx.Compact("a", "c"),
            fx.Arm("a", "c", DUE),
        ]
    )
    assert rec.order == ["summarize s", "compact", "arm", "notice session_saved"]
