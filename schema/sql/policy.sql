-- Retention by policy (worker/store/policy.py): which conversations' sessions expire, which
-- conversations' logs are due, and the record of each run. `contextlog_keep` (017) says how
-- long each conversation keeps what.

-- name: retention_expiring
-- Conversations holding sessions saved before their retention allows, with that cut-off.
SELECT c.agent, c.channel, %(now)s::timestamptz - make_interval(secs => k.keep) AS before
FROM conversations c,
     LATERAL (SELECT contextlog_keep(c.agent, c.keep_sessions_days, %(policies)s::jsonb,
                                     'sessions') AS keep) k
WHERE k.keep IS NOT NULL
  AND EXISTS (SELECT FROM sessions s WHERE s.agent = c.agent AND s.channel = c.channel
                AND s.created_at < %(now)s::timestamptz - make_interval(secs => k.keep))
ORDER BY c.agent, c.channel
LIMIT %(limit)s;

-- name: retention_due
-- Conversations whose log outlived its retention after their last activity (the last
-- message's time; a conversation without messages: its last event's), not an erase
-- record; `pinned`: a live session still holds them (kept until it expires or is deleted).
SELECT c.agent, c.channel, %(now)s::timestamptz - make_interval(secs => k.keep) AS before,
       EXISTS (SELECT FROM sessions s WHERE s.agent = c.agent AND s.channel = c.channel
                 AND s.deleted_at IS NULL) AS pinned
FROM conversations c,
     LATERAL (SELECT contextlog_keep(c.agent, c.keep_log_days, %(policies)s::jsonb,
                                     'log') AS keep) k
WHERE k.keep IS NOT NULL AND NOT starts_with(c.channel, 'contextlog:erase:')
  AND coalesce(c.last_activity_at, c.recorded_at, '-infinity')
      < %(now)s::timestamptz - make_interval(secs => k.keep)
ORDER BY pinned, coalesce(c.last_activity_at, c.recorded_at), c.agent, c.channel;

-- name: retention_set
-- `retention.v1`: a conversation's own rules (NULL keeps the value, 0 clears it).
UPDATE conversations SET
    keep_log_days = CASE WHEN %(log)s::integer IS NULL THEN keep_log_days
                         ELSE nullif(%(log)s::integer, 0) END,
    keep_sessions_days = CASE WHEN %(sessions)s::integer IS NULL THEN keep_sessions_days
                              ELSE nullif(%(sessions)s::integer, 0) END
WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: expire_sessions
-- `expire_sessions.v1`: the conversation's sessions saved before the cut-off go, rows and
-- all (deleted ones too); their ids are returned.
DELETE FROM sessions
WHERE agent = %(agent)s AND channel = %(channel)s AND created_at < %(before)s
RETURNING session_id;

-- name: expire_session_deliveries
-- The webhook bodies (021) of the expired sessions' summaries: their text goes with them.
DELETE FROM webhook_deliveries
WHERE agent = %(agent)s AND channel = %(channel)s AND kind = 'summary_ready'
  AND convert_from(payload, 'UTF8')::jsonb->'data'->>'session_id' = ANY(%(sessions)s::text[]);

-- name: retention_try_lock
-- One retention step at a time over every worker (released by `retention_unlock`).
SELECT pg_try_advisory_lock(%(lock)s) AS locked;

-- name: retention_unlock
SELECT pg_advisory_unlock(%(lock)s);

-- name: retention_run_start
INSERT INTO retention_runs (started_at) VALUES (%(at)s) RETURNING id;

-- name: retention_run_end
UPDATE retention_runs SET finished_at = %(at)s, conversations = %(conversations)s,
    events = %(events)s, expiring = %(expiring)s, pinned = %(pinned)s,
    left_due = %(left_due)s, error = %(error)s
WHERE id = %(id)s;

-- name: retention_run_drop
DELETE FROM retention_runs WHERE id = %(id)s;

-- name: retention_runs_trim
DELETE FROM retention_runs WHERE id <= %(id)s - 100;

-- name: retention_last_run
SELECT started_at, finished_at, conversations, events, expiring, pinned, left_due, error
FROM retention_runs ORDER BY id DESC LIMIT 1;
