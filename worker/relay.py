"""After commit, a batch's effects leave Postgres: notices to adapters, jobs to RQ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from contextlog.schema import notices as nt
from contextlog.worker.clock import Clock, SystemClock
from contextlog.worker.handlers import ARM, COMPACT, NOTICE, SUMMARIZE, Effect
from contextlog.worker.notify import Notifier

if TYPE_CHECKING:
    from contextlog.worker.idle import Timers
    from contextlog.worker.jobs import Jobs


class Relay:
    """Sends effects; raises `Unavailable` or a Redis error when Redis is away."""

    def __init__(
        self,
        notifier: Notifier,
        jobs: Jobs,
        timers: Timers | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.notifier = notifier
        self.jobs = jobs
        self.timers = timers
        self.clock = clock or SystemClock()

    def send(self, effects: Sequence[Effect]) -> None:
        """Notices in one round trip, timers in one, then one enqueue per job."""
        notices = [
            (str(x.body["source"]), nt.decode(str(x.body["notice"]).encode()))
            for x in effects
            if x.kind == NOTICE
        ]
        self.notifier.publish(notices)
        arms = [
            (x.body["agent"], x.body["channel"], x.body["due"]) for x in effects if x.kind == ARM
        ]
        if arms and self.timers is not None:
            self.timers.arm_many(arms, self.clock.now())
        for x in effects:
            if x.kind == SUMMARIZE:
                self.jobs.summarize(x.body["agent"], x.body["channel"], x.body["session_id"])
        compact = [(x.body["agent"], x.body["channel"]) for x in effects if x.kind == COMPACT]
        if compact:
            self.jobs.compact_many(compact)
