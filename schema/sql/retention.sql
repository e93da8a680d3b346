-- Retention (`contextlog retire`): whole conversations leave the log, archived first.
-- The log is partitioned by conversation (007), so old data goes by conversation, not by
-- time range; a conversation goes with everything derived from it, so the projections
-- stay what a replay of the remaining log gives.

-- name: retire_candidates
-- Conversations silent since before the cut-off, with whether a live (not deleted)
-- session still references their events (those are refused).
SELECT c.agent, c.channel,
       EXISTS (SELECT 1 FROM sessions s WHERE s.agent = c.agent AND s.channel = c.channel
                 AND s.deleted_at IS NULL) AS referenced
FROM conversations c
WHERE coalesce(c.last_activity_at, c.recorded_at, '-infinity') < %(before)s
  AND NOT starts_with(c.channel, 'contextlog:erase:')
ORDER BY c.agent, c.channel
LIMIT %(limit)s;

-- name: retire_lock
-- In the retiring transaction: waits for a rebuild (as ingest does), then locks the
-- conversation row, which ingest's next batch for it must update first, and checks
-- again that it is still silent and unreferenced. No row: leave it.
SELECT c.last_seq
FROM (SELECT pg_advisory_xact_lock_shared(%(rebuild_lock)s)) AS rebuild_lock,
     conversations c
WHERE c.agent = %(agent)s AND c.channel = %(channel)s
  AND coalesce(c.last_activity_at, c.recorded_at, '-infinity') < %(before)s
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent = c.agent AND s.channel = c.channel
                    AND s.deleted_at IS NULL)
FOR UPDATE OF c;

-- name: retire_events
-- The archive's lines: every column, so `retire --restore` puts back the very rows.
SELECT row_to_json(e)::text FROM events e
WHERE e.agent = %(agent)s AND e.channel = %(channel)s ORDER BY e.seq;

-- name: retire_delete
WITH gone AS (
    DELETE FROM events WHERE agent = %(agent)s AND channel = %(channel)s RETURNING 1
), s AS (
    DELETE FROM sessions WHERE agent = %(agent)s AND channel = %(channel)s
), t AS (
    DELETE FROM threads WHERE agent = %(agent)s AND channel = %(channel)s
), n AS (
    DELETE FROM notes WHERE agent = %(agent)s AND channel = %(channel)s
), f AS (
    DELETE FROM search_messages WHERE agent = %(agent)s AND channel = %(channel)s
), q AS (
    DELETE FROM search_pending WHERE agent = %(agent)s AND channel = %(channel)s
), r AS (
    DELETE FROM attachment_refs WHERE agent = %(agent)s AND channel = %(channel)s
    RETURNING sha256
), w AS (
    -- the webhook bodies of its notices (021): the words of its summaries, delivered or not
    DELETE FROM webhook_deliveries WHERE agent = %(agent)s AND channel = %(channel)s
), c AS (
    DELETE FROM conversations WHERE agent = %(agent)s AND channel = %(channel)s
)
-- The events removed, and the hashes they referenced: those no other event references are
-- deleted next (by the named queries of attachment bytes, which alone touch them).
SELECT (SELECT count(*) FROM gone) AS events,
       coalesce((SELECT array_agg(DISTINCT sha256) FROM r), '{}') AS hashes;

-- name: unretire_present
-- Whether the log holds any event of these conversations (a restore would clash).
SELECT DISTINCT agent, channel FROM events
WHERE (agent, channel) IN (SELECT * FROM unnest(%(agents)s::text[], %(channels)s::text[]));

-- name: unretire_insert
-- Archived rows back with their positions and seqs; `contextlog rebuild` then derives
-- the projections again.
-- The running totals (009) and marks (014) as archived; an archive written before them
-- has none (NULL: as for any row older than those).
INSERT INTO events (position, event_id, agent, channel, thread, seq, kind, occurred_at,
                    recorded_at, payload, tokens, through, late, mark)
OVERRIDING SYSTEM VALUE
SELECT r.position, r.event_id, r.agent, r.channel, r.thread, r.seq, r.kind, r.occurred_at,
       r.recorded_at, r.payload, r.tokens, r.through, r.late, r.mark
FROM json_populate_recordset(NULL::events, %(rows)s::json) AS r;
