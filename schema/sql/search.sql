-- Named queries of search (migration 016; the query syntax: schema/search.py).

-- name: search_messages
-- One page of an agent's matches. The newest %(window)s matches (a common word in a large
-- log: the newest, found without reading every match) are ranked by cover density
-- (words together and close rank higher; long messages are not favoured), newest first
-- among equals; `matches` counts them (a row with it alone when the page is past the
-- last hit). Run unprepared, so that the planner sees the query's words: the words index
-- for a rare one, the newest-first scan for a common one. What the page's rows show is
-- read next (`search_details`), by a statement that is planned once.
WITH found AS MATERIALIZED (
    -- The query inline (immutable: folded to a constant), so the planner weighs its
    -- words (a CTE of it would hide them), with its prefixes spelled out (016).
    SELECT s.agent, s.channel, s.seq, s.thread, s.position, s.recorded_at, s.role,
           s.sender,
           ts_rank_cd(s.words, contextlog_search_query(%(tsquery)s), 1) AS rank
    FROM search_messages s
    WHERE s.agent = %(agent)s AND s.words @@ contextlog_search_query(%(tsquery)s)
      AND (%(channel)s::text IS NULL OR s.channel = %(channel)s::text)
      AND (%(thread)s::text IS NULL OR s.thread = %(thread)s::text)
      AND (%(sender)s::text IS NULL OR s.sender = %(sender)s::text)
      AND (%(since)s::timestamptz IS NULL OR s.recorded_at >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR s.recorded_at < %(until)s::timestamptz)
    ORDER BY s.recorded_at DESC, s.position DESC
    LIMIT %(window)s
), page AS (
    SELECT * FROM found
    ORDER BY rank DESC, recorded_at DESC, position DESC
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT p.agent, p.channel, p.thread, p.seq, p.recorded_at AS at, p.sender, p.role, p.rank,
       m.matches
FROM (SELECT count(*) AS matches FROM found) m
LEFT JOIN page p ON true
ORDER BY p.rank DESC, p.recorded_at DESC, p.position DESC;

-- name: search_details
-- What a page's hits show, in the page's order: the event id and time, the snippet (the
-- words found between ** and **; ShortWord=0: a fragment may start or end on a
-- one-character word, which every Han or kana character is) and the live sessions that
-- hold each.
SELECT e.event_id,
       coalesce((e.payload->>'original_at')::timestamptz, e.occurred_at) AS occurred_at,
       ts_headline('contextlog_search',
                   contextlog_search_spaced(contextlog_search_text(e.payload)),
                   to_tsquery('contextlog_search', %(tsquery)s),
                   'StartSel=**, StopSel=**, MaxWords=24, MinWords=8, ShortWord=0, '
                   'MaxFragments=2, FragmentDelimiter=" … "') AS snippet,
       array(SELECT ss.session_id FROM sessions ss
             WHERE ss.agent = e.agent AND ss.channel = e.channel AND ss.deleted_at IS NULL
               AND e.seq = ANY(ss.seqs)
             ORDER BY ss.seq) AS sessions
FROM unnest(%(channels)s::text[], %(seqs)s::bigint[]) WITH ORDINALITY AS k(channel, seq, i)
JOIN events e ON e.agent = %(agent)s AND e.channel = k.channel AND e.seq = k.seq
ORDER BY k.i;

-- name: search_backfill_step
-- Index up to %(limit)s of the events stored before migration 016, newest first (the ones
-- people look for first); returns how many events it went through and where it is.
WITH state AS (
    SELECT below FROM search_backfill WHERE below > 0 FOR UPDATE
), batch AS MATERIALIZED (
    SELECT e.position FROM events e, state
    WHERE e.position < state.below
    ORDER BY e.position DESC
    LIMIT %(limit)s
), added AS (
    INSERT INTO search_messages
    SELECT r.* FROM search_rows r, state
    WHERE r.position >= (SELECT min(position) FROM batch) AND r.position < state.below
      AND r.words IS NOT NULL
    ON CONFLICT DO NOTHING
), moved AS (
    UPDATE search_backfill SET below = CASE WHEN (SELECT count(*) FROM batch) < %(limit)s
                                            THEN 0
                                            ELSE (SELECT min(position) FROM batch) END
    WHERE below > 0
    RETURNING below
)
SELECT (SELECT count(*) FROM batch) AS events, (SELECT below FROM moved) AS below;

-- name: search_backfill_left
-- Events stored before migration 016 not yet indexed (0: none), from their positions (an
-- upper bound where retention left gaps).
SELECT coalesce((SELECT greatest(0, b.below - (SELECT min(position) FROM events))
                 FROM search_backfill b WHERE b.below > 0), 0) AS left_events;

-- name: search_reindex
-- `contextlog rebuild`: every message's row again, from the log as it is now.
INSERT INTO search_messages
SELECT * FROM search_rows
WHERE position >= %(lo)s AND position < %(hi)s AND words IS NOT NULL;

-- name: search_backfill_done
UPDATE search_backfill SET below = 0;

-- name: position_bounds
SELECT coalesce(min(position), 0), coalesce(max(position), 0) FROM events;

-- name: statement_timeout
-- The connection's statement timeout (to put back after `set_statement_timeout`).
SELECT current_setting('statement_timeout') AS timeout;

-- name: set_statement_timeout
-- For the rest of the transaction (or until set again); undone with a savepoint.
SELECT set_config('statement_timeout', %(timeout)s, true);

-- name: search_index_pending
-- The indexer's step: up to %(limit)s queued messages into `search_messages` (a worker
-- shares the queue with the others: SKIP LOCKED). Each message is read under a share
-- lock, so an erase or retention that changes or removes it waits for this step (and
-- then removes its row), or is waited for (and what is read is what is left). Returns how
-- many were taken.
WITH taken AS (
    DELETE FROM search_pending
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM search_pending LIMIT %(limit)s
                           FOR UPDATE SKIP LOCKED))
    RETURNING agent, channel, seq
), found AS MATERIALIZED (
    SELECT r.* FROM taken t
    JOIN search_rows r ON r.agent = t.agent AND r.channel = t.channel AND r.seq = t.seq
    FOR SHARE OF r
), added AS (
    INSERT INTO search_messages
    SELECT * FROM found WHERE words IS NOT NULL
    ON CONFLICT DO NOTHING
)
SELECT count(*) AS taken FROM taken;

-- name: search_lag
-- Messages queued for the indexer, and when the first of them was logged (the oldest,
-- near enough: the queue is a heap written in order).
SELECT (SELECT count(*) FROM search_pending) AS waiting,
       (SELECT e.recorded_at FROM (SELECT * FROM search_pending LIMIT 1) p
        JOIN events e ON e.agent = p.agent AND e.channel = p.channel AND e.seq = p.seq)
       AS oldest;
