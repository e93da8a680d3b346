"""After commit, a batch's effects leave Postgres: notices to adapters, jobs to RQ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from contextlog.schema import notices as nt
from contextlog.schema.errors import Unavailable
from contextlog.worker.app import metrics
from contextlog.worker.app.clock import Clock, SystemClock
from contextlog.worker.effects.kinds import Arm, Compact, Effect, Notice, Scrub, Summarize
from contextlog.worker.effects.notify import Notifier

if TYPE_CHECKING:
    from contextlog.worker.effects.scrub import Scrubber
    from contextlog.worker.tasks.queue import Jobs
    from contextlog.worker.tasks.timers import Timers


class Relay:
    """Sends effects; raises `Unavailable` or a Redis error when Redis is away."""

    def __init__(
        self,
        notifier: Notifier,
        jobs: Jobs,
        timers: Timers | None = None,
        clock: Clock | None = None,
        scrubber: Scrubber | None = None,
    ) -> None:
        self.notifier = notifier
        self.jobs = jobs
        self.timers = timers
        self.clock = clock or SystemClock()
        self.scrubber = scrubber  # None: an erase's Redis scrub waits in the outbox

    def send(self, effects: Sequence[Effect]) -> None:
        """Jobs, then timers in one round trip, then notices in one.

        Notices go last: an adapter that hears `session_saved` may at once wait for the
        summary, so the job that writes it is queued before anyone is told.
        """
        for x in effects:
            if isinstance(x, Summarize):
                self.jobs.summarize(x.agent, x.channel, x.session_id, x.round)
        compact = [(x.agent, x.channel) for x in effects if isinstance(x, Compact)]
        if compact:
            self.jobs.compact_many(compact)
        arms = [(x.agent, x.channel, x.due) for x in effects if isinstance(x, Arm)]
        if arms and self.timers is not None:
            self.timers.arm_many(arms, self.clock.now())
        notices = [
            (x.source, nt.decode(x.notice.encode())) for x in effects if isinstance(x, Notice)
        ]
        # An erase's scrub before its notice: whoever hears `erase_done` finds Redis clean.
        for x in effects:
            if isinstance(x, Scrub):
                if self.scrubber is None:
                    raise Unavailable("no Redis scrubber here: the erase's scrub waits")
                self.scrubber.scrub(x)
                metrics.ERASED.labels(x.scope).inc(len(x.event_ids))
        self.notifier.publish(notices)
