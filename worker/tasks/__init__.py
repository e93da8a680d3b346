"""The RQ side: job entry points and what they run (summaries, compaction, idle saves, the
sweeper, the RQ worker)."""
