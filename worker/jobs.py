"""The RQ paths of jobs queued or scheduled before worker/ was split into rooms: a job
stored as `contextlog.worker.jobs.<name>` still resolves (new jobs name
`contextlog.worker.tasks.jobs`). Kept for one release after 0.1."""

from contextlog.worker.tasks.jobs import (
    compact_conversation,
    idle_check,
    idle_due,
    idle_part,
    summarize_session,
)

__all__ = ["compact_conversation", "idle_check", "idle_due", "idle_part", "summarize_session"]
