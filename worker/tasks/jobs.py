"""RQ jobs on the `summaries` queue: session summaries and context compaction.

Job functions are thin: they take the process's resources (built once by
`bootstrap.resources`) and call the core below, which tests call with fakes. A job's
result is an event pushed onto the conversation's shard stream, so ingest stays the
only writer of the log; its event id is derived from what it is about, so a job that
runs twice (a redelivery, a second enqueue) stores its result once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgspec
import redis
import structlog
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.executions import ExecutionRegistry
from rq.job import JobStatus

from contextlog.producers.context import StoredMessage
from contextlog.producers.ids import derived_id
from contextlog.producers.reader import ContextReader, stored, window_params
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected, Refused
from contextlog.schema.queries import query
from contextlog.worker.app import metrics
from contextlog.worker.store import sessions
from contextlog.worker.tasks import idle

if TYPE_CHECKING:
    from contextlog.worker.app.bootstrap import Resources
    from contextlog.worker.tasks.summarize import Summarizer, Summary

log = structlog.get_logger("contextlog.jobs")

SUMMARIES: Final = "summaries"
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
    return f"contextlog:compacting:{{{job_key(agent, channel)}}}"


def job_key(*parts: str) -> str:
    """A short, stable job id part for a conversation-scoped job (ids must be safe)."""
    return hashlib.sha1("\x00".join(parts).encode()).hexdigest()[:20]


class Jobs:
    """Enqueues contextlog's jobs; a job still queued or running is not queued twice."""

    def __init__(self, client: redis.Redis, job_timeout: int = 300) -> None:
        self.summaries = Queue(SUMMARIES, connection=client)
        self.job_timeout = job_timeout
        self._claim = client.register_script(_CLAIM)

    def summarize(self, agent: str, channel: str, session_id: str) -> bool:
        """Queue the summary of a saved session; False if it is already queued."""
        return self._enqueue(
            "contextlog.worker.tasks.jobs.summarize_session",
            (agent, channel, session_id),
            job_id=f"summarize-{job_key(agent, channel, session_id)}",
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
            "contextlog.worker.tasks.jobs.compact_conversation",
            (agent, channel),
            job_id=f"compact-{job_key(agent, channel)}",
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
        return sum(self.summarize(*row) for row in rows)


# -- the core, called with explicit resources ---------------------------------------


def run_summary(res: Resources, agent: str, channel: str, session_id: str) -> str:
    """Summarise a session's messages and push the summary as an event."""
    try:
        info, messages = res.reader.session_messages(session_id, agent=agent, channel=channel)
    except Refused as e:
        log.info("session gone, no summary", agent=agent, channel=channel, reason=str(e))
        return "skipped"
    summary = res.summarizer.summarize([(m.role, m.content) for m in messages], purpose="session")
    summary = _push_summary(res, agent, channel, info.session_id, summary)
    metrics.SUMMARIES.labels(
        "failed" if summary.failed else "local" if summary.local else "api"
    ).inc()
    log.info(
        "session summarised",
        agent=agent,
        channel=channel,
        session_id=session_id,
        local=summary.local,
        failed=summary.failed,
    )
    return "failed" if summary.failed else "done"


def _push_summary(
    res: Resources, agent: str, channel: str, session_id: str, summary: Summary
) -> Summary:
    """Push the summary as an event, made storable first (NUL removed, cut to the
    contract's length); one the contract still refuses is recorded as failed, so the
    session settles and the sweep does not ask the API again and again."""
    from contextlog.worker.tasks.summarize import FAILED_TEXT, Summary, storable

    text, changed = storable(summary.text)
    if changed:
        metrics.SUMMARY_UNSTORABLE.labels("sanitised").inc()
        log.warning("summary sanitised to fit the event contract", session_id=session_id)
    event = ev.SummaryGenerated(
        event_id=derived_id(JOB_SOURCE, f"summary\x00{agent}\x00{channel}\x00{session_id}"),
        agent=agent,
        channel=channel,
        occurred_at=res.clock.now(),
        session_id=session_id,
        summary=text,
        local=summary.local,
        failed=summary.failed,
    )
    try:
        res.producer.push(event)
        return summary._replace(text=text)
    except EventRejected as e:
        metrics.SUMMARY_UNSTORABLE.labels("failed").inc()
        log.warning(
            "summary refused by the contract; recorded as failed",
            error=str(e),
            session_id=session_id,
        )
    failed = Summary(FAILED_TEXT, local=summary.local, failed=True)
    res.producer.push(msgspec.structs.replace(event, summary=failed.text, failed=True))
    return failed


@dataclass(frozen=True)
class ThreadWindow:
    """What a compaction job reads of one thread."""

    thread: str
    previous: str | None  # the summary of the last compaction, folded into the next
    base_seq: int  # the conversation's cleared_seq when read
    budget: int
    messages: list[StoredMessage]


def read_windows(res: Resources, agent: str, channel: str) -> list[ThreadWindow]:
    """The windows of the conversation's threads that passed the compaction threshold."""
    now = res.clock.now()
    d = res.reader.defaults
    key = {
        "agent": agent,
        "channel": channel,
        "default_budget": d.token_budget,
        "compact_at": sessions.COMPACT_AT,
    }
    out = []
    with res.reader.connection() as conn:
        for thread, previous, base_seq, budget in conn.execute(
            query("threads_to_compact"), key
        ).fetchall():
            params = window_params(agent, channel, thread, now, d)
            rows = conn.execute(query("window_messages"), params).fetchall()
            out.append(ThreadWindow(thread, previous, int(base_seq), int(budget), stored(rows)))
    return out


def compaction_event(
    agent: str, channel: str, w: ThreadWindow, summarizer: Summarizer
) -> ev.ContextCompacted | None:
    """The compaction of one thread's window; None when the summary failed.

    A window found back under the threshold (its messages aged out of the rolling
    window) gets an event with `through_seq` 0 that only re-counts its tokens, so it
    stops triggering compactions.
    """
    total = sum(m.tokens for m in w.messages)
    through = (
        sessions.compaction_cut(w.messages) if sessions.over_threshold(total, w.budget) else None
    )
    # imports anthropic: workers only, not ingest
    from contextlog.worker.tasks.summarize import Summary, storable

    summary = Summary("")
    if through is not None:
        older = [(m.role, m.content) for m in w.messages if m.seq <= through]
        summary = summarizer.summarize(older, previous=w.previous, purpose="compaction")
        if summary.failed:
            return None
    seen = max((m.seq for m in w.messages), default=0)
    return ev.ContextCompacted(
        event_id=derived_id(JOB_SOURCE, f"compact\x00{agent}\x00{channel}\x00{w.thread}\x00{seen}"),
        agent=agent,
        channel=channel,
        thread=w.thread or None,
        occurred_at=dt.datetime.now(dt.UTC),
        through_seq=through or 0,
        base_seq=w.base_seq,
        seen_seq=seen,
        remaining_tokens=sum(m.tokens for m in w.messages if m.seq > (through or 0)),
        summary=storable(summary.text)[0],
        local=summary.local,
    )


def run_compaction(res: Resources, agent: str, channel: str) -> str:
    """Compact each thread of the conversation that passed the threshold."""
    try:
        return _compact(res, agent, channel)
    finally:
        # Not deleted: the compaction event still has to pass through ingest, and until
        # it lands the thread stays over the threshold.
        res.producer.redis.expire(compaction_claim(agent, channel), SETTLE_S)


def _compact(res: Resources, agent: str, channel: str) -> str:
    done = 0
    for w in read_windows(res, agent, channel):
        event = compaction_event(agent, channel, w, res.summarizer)
        metrics.COMPACTIONS.labels("failed" if event is None else "done").inc()
        if event is None:
            log.warning(
                "compaction summary failed; the context stays trimmed to budget",
                agent=agent,
                channel=channel,
                thread=w.thread,
            )
            continue
        res.producer.push(msgspec.structs.replace(event, occurred_at=res.clock.now()))
        done += event.through_seq > 0
    return f"compacted {done} threads"


# -- RQ entry points ------------------------------------------------------------------


def summarize_session(agent: str, channel: str, session_id: str) -> str:
    """RQ job: the summary of one saved session."""
    from contextlog.worker.app.bootstrap import resources

    return run_summary(resources(), agent, channel, session_id)


def compact_conversation(agent: str, channel: str) -> str:
    """RQ job: compact the conversation's threads that passed 75% of their budget."""
    from contextlog.worker.app.bootstrap import resources

    return run_compaction(resources(), agent, channel)


def idle_due(bucket: str) -> str:
    """RQ job on `idle`: the second of a bucket of idle deadlines came."""
    from contextlog.worker.app.bootstrap import resources

    return idle.run_bucket(resources(), bucket, _current_job_id())


def idle_part(convs: list[tuple[str, str]]) -> str:
    """RQ job on `idle`: a part of a bucket too large for one job."""
    from contextlog.worker.app.bootstrap import resources

    done = idle.run_checks(resources(), [(a, c) for a, c in convs], _current_job_id())
    return f"checked {len(done)}"


def idle_check(agent: str, channel: str) -> str:
    """RQ job on `idle` as versions before buckets scheduled it (one per conversation);
    kept so that jobs scheduled before an upgrade still run."""
    from contextlog.worker.app.bootstrap import resources

    return idle.run_checks(resources(), [(agent, channel)], _current_job_id())[(agent, channel)]


def _current_job_id() -> str:
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    return job.id
