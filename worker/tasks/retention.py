"""The worker's retention step and search backfill, run by its sweeper every
CONTEXTLOG_SWEEP_SECONDS (bootstrap.sweep_forever): thin, around worker/store/policy.py
and worker/store/search.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Final

import psycopg
import structlog
from psycopg.rows import TupleRow

from contextlog.producers.producer import Producer
from contextlog.schema.queries import query
from contextlog.worker.app import metrics
from contextlog.worker.app.config import Settings
from contextlog.worker.store import policy, search

log = structlog.get_logger("contextlog.retention")

# Events one sweep indexes for search at most (older logs catch up over several sweeps).
BACKFILL_BUDGET: Final = 200_000


def run_step(
    settings: Settings,
    connect: Callable[[], psycopg.Connection[TupleRow]],
    producer: Producer,
    now: dt.datetime,
) -> policy.Run | None:
    """One retention step, recorded in `retention_runs` and the metrics; None when another
    worker is running one."""
    archive = Path(settings.retention_archive) if settings.retention_archive else None
    with connect() as conn:
        (run_id,) = conn.execute(query("retention_run_start"), {"at": now}).fetchone() or (0,)
        conn.commit()
        try:
            run = policy.step(
                conn,
                settings.retention,
                now,
                lambda events: producer.push_many(events),
                limit=settings.retention_batch,
                archive=archive,
            )
        except Exception as e:
            _record(conn, run_id, now, policy.Run(error=f"{type(e).__name__}: {e}"[:500]))
            raise
        if run is None:  # another worker's step runs: it records its own
            conn.execute(query("retention_run_drop"), {"id": run_id})
            conn.commit()
            return None
        _record(conn, run_id, now, run)
    _count(run)
    return run


def _record(
    conn: psycopg.Connection[TupleRow], run_id: int, now: dt.datetime, run: policy.Run
) -> None:
    conn.rollback()
    conn.execute(
        query("retention_run_end"),
        {
            "id": run_id,
            "at": now,
            "conversations": run.conversations,
            "events": run.events,
            "expiring": run.expiring,
            "pinned": run.pinned,
            "left_due": run.left_due,
            "error": run.error,
        },
    )
    conn.execute(query("retention_runs_trim"), {"id": run_id})
    conn.commit()


def _count(run: policy.Run) -> None:
    metrics.RETENTION_DROPPED.inc(run.conversations)
    metrics.RETENTION_EVENTS.inc(run.events)
    metrics.RETENTION_EXPIRING.inc(run.expiring)
    metrics.RETENTION_DUE.labels("left").set(run.left_due)
    metrics.RETENTION_DUE.labels("pinned").set(run.pinned)
    if run.conversations or run.expiring:
        log.info(
            "retention step",
            conversations=run.conversations,
            events=run.events,
            expiring=run.expiring,
            pinned=run.pinned,
            left=run.left_due,
        )


def backfill_step(connect: Callable[[], psycopg.Connection[TupleRow]]) -> int:
    """Index a bounded part of the messages stored before search existed; returns how many
    events it went through."""
    with connect() as conn:
        done = search.backfill(conn, BACKFILL_BUDGET)
        left = search.backfill_left(conn)
    metrics.SEARCH_BACKFILL.set(left)
    if done:
        log.info("search backfill", events=done, left=left)
    return done
