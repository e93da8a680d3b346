"""RQ jobs on the `summaries` queue: session summaries and context compaction (queued by
tasks/queue.py).

Job functions are thin: they take the process's resources (built once by the
composition root, `tasks.resources.current`) and call the core below, which tests call
with fakes. A job's result is an event pushed onto the conversation's shard stream, so
ingest stays the only writer of the log; its event id is derived from what it is about,
so a job that runs twice (a redelivery, a second enqueue) stores its result once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import structlog

from contextlog.producers.context import COMPACT_AT
from contextlog.producers.ids import derived_id
from contextlog.schema import events as ev
from contextlog.schema.errors import EventRejected, Refused
from contextlog.schema.queries import query
from contextlog.worker.app import metrics
from contextlog.worker.tasks import compaction, idle
from contextlog.worker.tasks.queue import JOB_SOURCE, SETTLE_S, compaction_claim
from contextlog.worker.tasks.resources import current

if TYPE_CHECKING:
    from contextlog.worker.tasks.resources import Resources
    from contextlog.worker.tasks.summarize import Summary

log = structlog.get_logger("contextlog.jobs")


# -- the core, called with explicit resources ---------------------------------------


def run_summary(res: Resources, agent: str, channel: str, session_id: str, round: int = 0) -> str:
    """Summarise a session's messages and push the summary (of its summary `round`) as an
    event."""
    try:
        info, messages = res.reader.session_messages(session_id, agent=agent, channel=channel)
    except Refused as e:
        log.info("session gone, no summary", agent=agent, channel=channel, reason=str(e))
        return "skipped"
    summary = res.summarizer.summarize([(m.role, m.content) for m in messages], purpose="session")
    summary = _push_summary(res, agent, channel, info.session_id, summary, round)
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
    res: Resources, agent: str, channel: str, session_id: str, summary: Summary, round: int = 0
) -> Summary:
    """Push the summary as an event, made storable first (NUL removed, cut to the
    contract's length); one the contract still refuses is recorded as failed, so the
    session settles and the sweep does not ask the API again and again."""
    from contextlog.worker.tasks.summarize import FAILED_TEXT, Summary, storable

    text, changed = storable(summary.text)
    if changed:
        metrics.SUMMARY_UNSTORABLE.labels("sanitised").inc()
        log.warning("summary sanitised to fit the event contract", session_id=session_id)
    about = f"summary\x00{agent}\x00{channel}\x00{session_id}" + (f"\x00{round}" if round else "")
    event = ev.SummaryGenerated(
        event_id=derived_id(JOB_SOURCE, about),
        agent=agent,
        channel=channel,
        occurred_at=res.clock.now(),
        session_id=session_id,
        summary=text,
        local=summary.local,
        failed=summary.failed,
        round=round,
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


def threads_to_compact(res: Resources, agent: str, channel: str) -> list[tuple[str, str | None]]:
    """The conversation's threads whose segment passed the compaction threshold with no
    summary of ours waiting to land, and their summary so far (folded into the next)."""
    params = {
        "agent": agent,
        "channel": channel,
        "default_budget": res.reader.defaults.token_budget,
        "compact_at": COMPACT_AT,
    }
    with res.reader.connection() as conn:
        rows = conn.execute(query("threads_to_compact"), params).fetchall()
    return [(str(thread), summary) for thread, summary in rows]


def compaction_event(
    res: Resources, p: compaction.Plan, previous: str | None
) -> ev.ContextCompacted | None:
    """The API's compaction of the plan where the conversation's model has it, our own
    summary otherwise (or when the API gave no block); None when both failed."""
    now = res.clock.now()
    frame = p.context.frame
    if res.compactor is not None and frame is not None and compaction.supports(frame.model):
        block = res.compactor.compact(p)
        if block is not None:
            metrics.COMPACTIONS.labels("api").inc()
            return compaction.api_event(p, block, now)
    event = compaction.summary_event(p, res.summarizer, previous, now)
    metrics.COMPACTIONS.labels("failed" if event is None else "done").inc()
    return event


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
    for thread, previous in threads_to_compact(res, agent, channel):
        p = compaction.plan(res.reader, agent, channel, thread)
        if p is None:
            continue
        event = compaction_event(res, p, previous)
        if event is None:
            log.warning(
                "compaction summary failed; the budget cuts the segment instead",
                agent=agent,
                channel=channel,
                thread=thread,
            )
            continue
        res.producer.push(event)
        done += 1
    return f"compacted {done} threads"


# -- RQ entry points ------------------------------------------------------------------


def summarize_session(agent: str, channel: str, session_id: str, round: str = "0") -> str:
    """RQ job: the summary of one saved session (of its summary round, after an erase)."""
    return run_summary(current(), agent, channel, session_id, int(round))


def compact_conversation(agent: str, channel: str) -> str:
    """RQ job: compact the conversation's threads that passed 75% of their budget."""
    return run_compaction(current(), agent, channel)


def idle_due(bucket: str) -> str:
    """RQ job on `idle`: the second of a bucket of idle deadlines came."""
    return idle.run_bucket(current(), bucket, _current_job_id())


def idle_part(convs: list[tuple[str, str]]) -> str:
    """RQ job on `idle`: a part of a bucket too large for one job."""
    done = idle.run_checks(current(), [(a, c) for a, c in convs], _current_job_id())
    return f"checked {len(done)}"


def idle_check(agent: str, channel: str) -> str:
    """RQ job on `idle` as versions before buckets scheduled it (one per conversation);
    kept so that jobs scheduled before an upgrade still run."""
    return idle.run_checks(current(), [(agent, channel)], _current_job_id())[(agent, channel)]


def _current_job_id() -> str:
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    return job.id
