"""What a committed batch asks to be done outside Postgres: the typed effects, the outbox,
the relay, notices."""
