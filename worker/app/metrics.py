"""Prometheus metrics of the ingest and worker processes (`--metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

EVENTS = Counter("contextlog_events_ingested", "Events appended to the log (new, not redelivered)")
BATCH_SECONDS = Histogram(
    "contextlog_batch_seconds",
    "Time to append one shard batch (one Postgres transaction)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DEAD_LETTERS = Counter("contextlog_dead_letters", "Entries dead-lettered", ["reason"])
SUMMARIES = Counter(
    "contextlog_summaries", "Session summaries written, by outcome", ["outcome"]
)  # outcome: api, local, failed
COMPACTIONS = Counter("contextlog_compactions", "Compactions, by outcome", ["outcome"])
IDLE_CHECKS = Counter("contextlog_idle_checks", "Idle checks, by what they did", ["outcome"])
IDLE_DELAY = Histogram(
    "contextlog_idle_delay_seconds",
    "How long after its deadline an idle conversation was saved",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
BACKGROUND_ERRORS = Counter(
    "contextlog_background_errors",
    "Cycles of a worker's background thread that raised (logged with a traceback)",
    ["thread"],
)
BACKGROUND_UP = Gauge(
    "contextlog_background_up", "1 while a worker's background thread runs", ["thread"]
)
SUMMARY_UNSTORABLE = Counter(
    "contextlog_summary_unstorable",
    "API answers the event contract refuses, by what was done",
    ["action"],
)  # action: sanitised, failed


RETENTION_DROPPED = Counter(
    "contextlog_retention_conversations", "Conversations the retention step dropped whole"
)
RETENTION_EVENTS = Counter("contextlog_retention_events", "Events the retention step removed")
RETENTION_EXPIRING = Counter(
    "contextlog_retention_expiring",
    "Conversations the retention step told to expire sessions (expire_sessions.v1 pushed)",
)
RETENTION_DUE = Gauge(
    "contextlog_retention_due",
    "Conversations past their retention at the last step: left for the next, or pinned",
    ["state"],
)  # state: left (beyond the step's bound), pinned (a live session holds them)
SEARCH_INDEXED = Counter(
    "contextlog_search_indexed", "Messages the search indexer took from its queue"
)
SEARCH_BACKFILL = Gauge(
    "contextlog_search_backfill_left",
    "Events stored before search existed that are not indexed yet (the sweeper indexes them)",
)
ERASED = Counter(
    "contextlog_erased_events",
    "Events an erase redacted, dropped or blanked (counted when its Redis scrub ran)",
    ["scope"],
)


def serve(port: int | None, bind: str = "127.0.0.1") -> None:
    """Expose /metrics on `port` (nothing when None)."""
    if port is not None:
        start_http_server(port, addr=bind)
