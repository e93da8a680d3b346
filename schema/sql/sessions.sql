-- Named queries of saved sessions, restore and compaction (loaded with queries.sql).

-- name: save_window
-- A conversation's whole window (all threads) as of a save event at seq %(seq)s and
-- recorded time %(at)s: its messages since the last clear within the rolling window (by
-- the time ingest recorded them), and a restored session's while its restore is; not
-- cut by the budget or a compaction (a session keeps every message; restoring it fits
-- them to the budget again).
WITH w AS (
    SELECT cleared_seq, restored_seqs, restored_at,
           %(at)s::timestamptz - make_interval(
               secs => coalesce(rolling_window, %(default_window)s)) AS cutoff
    FROM conversations WHERE agent = %(agent)s AND channel = %(channel)s
), c AS MATERIALIZED (
    SELECT w.*, contextlog_seq_at(%(agent)s, %(channel)s, w.cutoff, w.cleared_seq + 1) AS lo
    FROM w
)
SELECT e.seq, e.thread, e.occurred_at, e.tokens, e.payload->>'role' AS role,
       e.payload->'content' AS content
FROM c JOIN events e
  ON e.agent = %(agent)s AND e.channel = %(channel)s AND e.kind = 'message.v1'
 AND e.seq >= c.lo AND e.seq < %(seq)s
UNION ALL
SELECT e.seq, e.thread, e.occurred_at, e.tokens, e.payload->>'role', e.payload->'content'
FROM c JOIN events e
  ON e.agent = %(agent)s AND e.channel = %(channel)s AND e.seq = ANY(c.restored_seqs)
WHERE c.restored_at >= c.cutoff
ORDER BY 1;

-- name: session_ids_from
-- Ids of this conversation starting with a base id, deleted ones included: an id is
-- never given to a second session.
SELECT session_id FROM sessions
WHERE agent = %(agent)s AND channel = %(channel)s AND starts_with(session_id, %(base)s);

-- name: insert_session
INSERT INTO sessions (agent, channel, session_id, seq, created_at, description, preview,
                      message_count, token_estimate, auto, source, provider, model, seqs,
                      window_start, window_end, summary, summary_local, imported_from)
VALUES (%(agent)s, %(channel)s, %(session_id)s, %(seq)s, %(created_at)s, %(description)s,
        %(preview)s, %(message_count)s, %(token_estimate)s, %(auto)s, %(source)s,
        %(provider)s, %(model)s, %(seqs)s, %(window_start)s, %(window_end)s, %(summary)s,
        %(summary_local)s, %(imported_from)s);

-- name: find_session
-- A session by id, this conversation's first if several conversations use the id.
SELECT agent, channel, session_id, seqs, deleted_at, summary FROM sessions
WHERE session_id = %(session_id)s
ORDER BY (agent = %(agent)s AND channel = %(channel)s) DESC LIMIT 1;

-- name: last_session
SELECT agent, channel, session_id, seqs, deleted_at, summary FROM sessions
WHERE agent = %(agent)s AND channel = %(channel)s AND deleted_at IS NULL
ORDER BY seq DESC LIMIT 1;

-- name: restore_conversation
-- As a clear at the restore's seq, then the session's messages, recent from now on.
UPDATE conversations
SET cleared_seq = %(seq)s, cleared_at = %(at)s, restored_seqs = %(seqs)s,
    restored_session = %(session_id)s, restored_at = %(at)s
WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: forget_restore
UPDATE conversations SET restored_seqs = NULL, restored_session = NULL, restored_at = NULL
WHERE agent = %(agent)s AND channel = %(channel)s AND restored_session IS NOT NULL;

-- name: delete_session
UPDATE sessions SET deleted_at = %(at)s
WHERE agent = %(agent)s AND channel = %(channel)s AND session_id = %(session_id)s;

-- name: purge_sessions
UPDATE sessions SET deleted_at = %(at)s
WHERE agent = %(agent)s AND channel = %(channel)s AND deleted_at IS NULL
  AND session_id NOT IN (
      SELECT session_id FROM sessions
      WHERE agent = %(agent)s AND channel = %(channel)s AND deleted_at IS NULL
      ORDER BY seq DESC LIMIT %(keep)s)
RETURNING session_id;

-- name: set_summary
-- The first summary of the session's current round wins: a job that ran twice emits the
-- same event id, deduplicated in the log, and an imported summary is never overwritten
-- either. A summary of an earlier round (written before an erase touched the session's
-- messages, 017) no longer applies.
UPDATE sessions SET summary = %(summary)s, summary_local = %(local)s,
                    summary_failed = %(failed)s
WHERE agent = %(agent)s AND channel = %(channel)s AND session_id = %(session_id)s
  AND summary IS NULL AND summary_round = %(round)s
RETURNING source, auto;

-- name: stale_summary
-- Whether a summary of round %(round)s came too late: its session has moved on to a later
-- round (an erase touched its messages since the summary job read them).
SELECT 1 FROM sessions
WHERE agent = %(agent)s AND channel = %(channel)s AND session_id = %(session_id)s
  AND summary_round > %(round)s;

-- name: imported_messages
-- The messages an import pushed before its session_imported event, newest first.
SELECT seq, thread, coalesce((payload->>'original_at')::timestamptz, occurred_at) AS occurred_at,
       tokens, payload->>'role' AS role, payload->'content' AS content
FROM events
WHERE agent = %(agent)s AND channel = %(channel)s AND seq < %(seq)s
  AND kind = 'imported_message.v1' AND payload->>'import_id' = %(import_id)s
ORDER BY seq DESC LIMIT %(count)s;

-- name: session_messages
SELECT seq, thread, coalesce((payload->>'original_at')::timestamptz, occurred_at) AS occurred_at,
       tokens, payload->>'role' AS role, payload->'content' AS content
FROM events
WHERE agent = %(agent)s AND channel = %(channel)s AND seq = ANY(%(seqs)s)
ORDER BY seq;

-- name: take_effects
-- Effects left by a crash between commit and relay, oldest first; SKIP LOCKED lets
-- two relays share the work.
SELECT id, kind, body FROM effects
WHERE created_at < now() - make_interval(secs => %(older_than)s)
ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED;

-- name: delete_effects
DELETE FROM effects WHERE id = ANY(%(ids)s);

-- name: insert_effects
INSERT INTO effects (kind, body)
SELECT kind, body FROM json_to_recordset(%(rows)s::json) AS x(kind text, body jsonb)
RETURNING id;

-- name: list_sessions
-- One page of a conversation's (or an agent's) live sessions, newest first.
SELECT agent, channel, session_id, created_at, description, summary, message_count,
       token_estimate, auto, preview, summary_local, summary_failed, provider, model,
       window_start, window_end, imported_from, count(*) OVER () AS total
FROM sessions
WHERE agent = %(agent)s AND (%(channel)s::text IS NULL OR channel = %(channel)s)
  AND deleted_at IS NULL
ORDER BY created_at DESC, seq DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: get_session
-- A live session by id, in one conversation when given (ids are unique per conversation).
SELECT agent, channel, session_id, created_at, description, summary, message_count,
       token_estimate, auto, preview, summary_local, summary_failed, provider, model,
       window_start, window_end, imported_from, seqs
FROM sessions
WHERE session_id = %(session_id)s AND deleted_at IS NULL
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(channel)s::text IS NULL OR channel = %(channel)s)
ORDER BY agent, channel LIMIT 50;

-- name: pending_summaries
-- Sessions whose summary has not landed after a grace period: their job was lost
-- (a crash between commit and relay is covered by `effects`; this covers the rest).
SELECT agent, channel, session_id, summary_round FROM sessions
WHERE summary IS NULL AND deleted_at IS NULL
  AND created_at < %(now)s::timestamptz - make_interval(secs => %(grace)s)
ORDER BY created_at LIMIT %(limit)s;

-- name: mark_saved
UPDATE conversations SET last_saved_seq = %(seq)s
WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: idle_states
-- What the idle checks read of many conversations at once.
SELECT c.agent, c.channel, coalesce(c.idle_timeout, %(default)s), c.last_activity_at,
       c.last_message_seq, c.cleared_seq, c.last_saved_seq, c.source
FROM unnest(%(agents)s::text[], %(channels)s::text[]) AS k(agent, channel)
JOIN conversations c ON c.agent = k.agent AND c.channel = k.channel;

-- name: idle_candidates
-- Conversations that need an idle timer: a timeout and messages since the last save or
-- clear; with their deadline.
SELECT agent, channel,
       last_activity_at + make_interval(secs => coalesce(idle_timeout, %(default)s))
FROM conversations
WHERE coalesce(idle_timeout, %(default)s) > 0 AND last_activity_at IS NOT NULL
  AND last_message_seq > greatest(cleared_seq, last_saved_seq);

-- name: summary_backlog
SELECT count(*), min(created_at) FROM sessions WHERE summary IS NULL AND deleted_at IS NULL;

-- name: effects_waiting
SELECT count(*) FROM effects;
