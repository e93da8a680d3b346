"""After commit, a batch's effects leave Postgres: notices to adapters, jobs to RQ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from schema import notices as nt
from worker.handlers import COMPACT, NOTICE, SUMMARIZE, Effect
from worker.notify import Notifier

if TYPE_CHECKING:
    from worker.jobs import Jobs


class Relay:
    """Sends effects; raises `Unavailable` or a Redis error when Redis is away."""

    def __init__(self, notifier: Notifier, jobs: Jobs) -> None:
        self.notifier = notifier
        self.jobs = jobs

    def send(self, effects: Sequence[Effect]) -> None:
        """Notices in one round trip, then one enqueue per job."""
        notices = [
            (str(x.body["source"]), nt.decode(str(x.body["notice"]).encode()))
            for x in effects
            if x.kind == NOTICE
        ]
        self.notifier.publish(notices)
        for x in effects:
            if x.kind == SUMMARIZE:
                self.jobs.summarize(x.body["agent"], x.body["channel"], x.body["session_id"])
            elif x.kind == COMPACT:
                self.jobs.compact(x.body["agent"], x.body["channel"])
