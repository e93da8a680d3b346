-- Named queries of reads from a streaming replica (loaded with queries.sql); see
-- producers/replica.py for how the reader uses them.

-- name: await_event_at
-- `await_event` on the primary, with its WAL insert position, taken once the event is
-- visible: a snapshot that sees the event began after its transaction's commit record was
-- inserted, so this position is at or after that record (the insert position, not the
-- write or flush one: it holds even under synchronous_commit = off). A replica that has
-- replayed up to it sees the event.
SELECT pg_current_wal_insert_lsn()::text
FROM contextlog_await_event(%(event_id)s, %(agent)s, %(channel)s, %(timeout)s) looks
WHERE looks IS NOT NULL;

-- name: replica_replayed
-- On the replica: whether it has replayed the WAL up to %(lsn)s (NULL off a standby).
SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn;

-- name: replica_lag
-- On the replica: how far behind it is, in seconds, as the standby itself can tell. 0 when
-- it has replayed all the WAL it received; else the time since the commit of the last
-- transaction it replayed (so an idle primary does not look like lag). WAL the primary has
-- not sent yet is not counted: on a healthy stream that is milliseconds, and with the
-- primary gone the replica serves what it had (see README, "Read replicas").
SELECT pg_is_in_recovery(),
       CASE WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn()
            THEN 0.0
            ELSE coalesce(extract(epoch FROM clock_timestamp()
                                             - pg_last_xact_replay_timestamp())::float8,
                          'Infinity') END;
