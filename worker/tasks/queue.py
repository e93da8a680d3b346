"""Queueing contextlog's jobs on RQ (`summaries`): what ingest's relay and the sweeper
need, without the job bodies (tasks/jobs.py), which import the Anthropic SDK.

A job still queued or running is not queued twice; a conversation's compaction is
claimed in Redis while it is queued or running.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from typing import Any, Final

import redis
import structlog
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.executions import ExecutionRegistry
from rq.job import JobStatus

from contextlog.producers.reader import ContextReader
from contextlog.schema import keys
from contextlog.schema.queries import query

log = structlog.get_logger("contextlog.jobs")

SUMMARIES: Final = "summaries"
JOBS_MODULE: Final = "contextlog.worker.tasks.jobs"  # where RQ finds the job functions
JOB_SOURCE: Final = "contextlog-jobs"  # the namespace of derived result event ids
RESULT_TTL: Final = 3600  # finished jobs stay visible in rq-dashboard for an hour
FAILURE_TTL: Final = 7 * 86400
_DEAD: Final = (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


# SET NX EX over every key: 1 where this call took the claim.
_CLAIM = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('SET', key, '1', 'NX', 'EX', ARGV[1]) and 1 or 0
end
return out
"""
CLAIM_TTL_S: Final = 600  # a compaction claim outlives a job that died by this much
SETTLE_S: Final = 10  # after a compaction, time for its event to land before the next


def compaction_claim(agent: str, channel: str) -> str:
    """The key that says a compaction of the conversation is queued or running."""
    return keys.compaction_claim(job_key(agent, channel))


def job_key(*parts: str) -> str:
    """A short, stable job id part for a conversation-scoped job (ids must be safe)."""
    return hashlib.sha1("\x00".join(parts).encode()).hexdigest()[:20]


def summary_job_id(agent: str, channel: str, session_id: str, round: int = 0) -> str:
    """The RQ job id of a session's summary (of a summary round after the first)."""
    parts = (agent, channel, session_id, *((str(round),) if round else ()))
    return f"summarize-{job_key(*parts)}"


def compaction_job_id(agent: str, channel: str) -> str:
    """The RQ job id of a conversation's compaction."""
    return f"compact-{job_key(agent, channel)}"


class Jobs:
    """Enqueues contextlog's jobs; a job still queued or running is not queued twice."""

    def __init__(self, client: redis.Redis, job_timeout: int = 300) -> None:
        self.summaries = Queue(SUMMARIES, connection=client)
        self.job_timeout = job_timeout
        self._claim = client.register_script(_CLAIM)

    def summarize(self, agent: str, channel: str, session_id: str, round: int = 0) -> bool:
        """Queue the summary of a saved session (of its summary `round`: an erase asks
        for a new one); False if it is already queued."""
        args: tuple[str, ...] = (agent, channel, session_id)
        if round:
            args = (*args, str(round))
        return self._enqueue(
            f"{JOBS_MODULE}.summarize_session",
            args,
            job_id=summary_job_id(agent, channel, session_id, round),
            description=f"summarize session {session_id} ({agent}/{channel})",
            result_ttl=RESULT_TTL,
        )

    def compact_many(self, convs: Sequence[tuple[str, str]]) -> int:
        """Queue compactions for conversations that have none claimed: one Redis call
        claims them all (a conversation over the threshold triggers on every batch until
        its compaction lands). Returns how many were queued."""
        if not convs:
            return 0
        claimed: Any = self._claim(
            keys=[compaction_claim(a, c) for a, c in convs], args=[CLAIM_TTL_S]
        )
        return sum(self.compact(a, c) for (a, c), ok in zip(convs, claimed, strict=True) if ok)

    def compact(self, agent: str, channel: str) -> bool:
        """Queue a compaction of a conversation; at most one is queued or running."""
        return self._enqueue(
            f"{JOBS_MODULE}.compact_conversation",
            (agent, channel),
            job_id=compaction_job_id(agent, channel),
            description=f"compact context ({agent}/{channel})",
            # Removed when done, so the next compaction of this conversation can queue.
            result_ttl=0,
        )

    def _enqueue(
        self,
        func: str,
        args: tuple[str, ...],
        *,
        job_id: str,
        description: str,
        result_ttl: int,
        replace: bool = True,
    ) -> bool:
        try:
            self.summaries.enqueue_call(
                func,
                args=args,
                job_id=job_id,
                description=description,
                timeout=self.job_timeout,
                result_ttl=result_ttl,
                failure_ttl=FAILURE_TTL if result_ttl else 300,
                unique=True,  # refused, not overwritten, while the id is taken
            )
        except DuplicateJobError:
            if not replace or not self._delete_dead(job_id):
                return False
            # Once only: a job that reappeared meanwhile was queued by someone else.
            return self._enqueue(
                func,
                args,
                job_id=job_id,
                description=description,
                result_ttl=result_ttl,
                replace=False,
            )
        return True

    def _delete_dead(self, job_id: str) -> bool:
        """Free a job id held by a failed or stopped job (a worker died in it), or by one
        said to be queued that is in no queue (a worker killed between RQ's pop and its
        start mark loses it so); one still queued, scheduled or running is left alone.
        True when the id is free now."""
        job = self.summaries.fetch_job(job_id)
        if job is None:
            return True  # gone between the refusal and now: the id is free
        status = job.get_status(refresh=True)
        lost = status == JobStatus.QUEUED and self._not_in_queue(job_id)
        if status not in _DEAD and not lost:
            return False
        try:
            job.delete()
        except NoSuchJobError:
            return True
        except ValueError as e:
            # rq 3.0 keeps a job's execution index 60 s longer than the executions it
            # lists, and Job.delete fetches each: "Execution ... not found" after a worker
            # died in the job. The job is dead, so its executions are over: drop the index.
            log.info(
                "dead job's execution expired; deleting its index", job_id=job_id, error=str(e)
            )
            self.summaries.connection.delete(ExecutionRegistry(job_id, job.connection).key)
            try:
                job.delete()
            except (ValueError, NoSuchJobError) as again:
                log.warning("dead job not deleted; next sweep", job_id=job_id, error=str(again))
                return False
        return True

    def _not_in_queue(self, job_id: str) -> bool:
        client: Any = self.summaries.connection
        return client.lpos(self.summaries.key, job_id) is None

    def requeue_pending(self, reader: ContextReader, now: dt.datetime, grace: float) -> int:
        """Queue again the summaries still missing `grace` seconds after their save."""
        params = {"now": now, "grace": grace, "limit": 10_000}
        with reader.connection() as conn:
            rows = conn.execute(query("pending_summaries"), params).fetchall()
        return sum(self.summarize(a, c, sid, int(r)) for a, c, sid, r in rows)
