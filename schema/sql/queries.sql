-- Named queries, loaded once by schema.queries. Each starts with a `-- name: NAME` line.

-- name: existing_event_ids
-- By (event_id, conversation), the key of the event id guard: each probe prunes to the
-- conversation's partition (007).
SELECT e.event_id, e.agent, e.channel
FROM unnest(%(ids)s::uuid[], %(agents)s::text[], %(channels)s::text[]) AS x(event_id, agent, channel)
JOIN events e USING (event_id, agent, channel);

-- name: advance_checkpoint
-- Fencing, the rebuild lock and the commit signal: see `contextlog_advance_checkpoint` (012).
-- First in every batch: its row lock serialises two writers of a shard.
SELECT contextlog_advance_checkpoint(%(shard)s::integer, %(epoch)s::bigint,
                                     %(last_entry_id)s, %(events)s::bigint,
                                     %(rebuild_lock)s::bigint);

-- name: count_checkpoint_events
-- After a redelivery, the events of the batch that were new (the optimistic path counts
-- them in `advance_checkpoint`).
UPDATE shard_checkpoints SET events = events + %(events)s WHERE shard = %(shard)s;

-- name: advance_conversations
-- Sequence numbers reserved and the batch's projection changes folded in: see
-- `contextlog_advance_conversations` (012).
SELECT agent, channel, last_seq, idle_timeout, last_activity_at
FROM contextlog_advance_conversations(%(conversations)s::json);

-- name: advance_threads
-- Running totals, and the compaction candidates: see `contextlog_advance_threads` (012).
SELECT agent, channel, thread, tokens_through, last_activity_at, compact
FROM contextlog_advance_threads(%(thread_rows)s::json, %(default_budget)s::integer,
                                %(compact_at)s::double precision);

-- name: copy_events
-- `through` and `late`: see migration 009 (commands: NULL and false).
COPY events (event_id, agent, channel, thread, seq, kind, occurred_at, tokens, through,
             late, payload)
FROM STDIN;

-- name: append_messages
-- A batch small enough to travel as parameters, whole, in one statement (run in autocommit
-- mode, its own transaction): see `contextlog_append` (012). Conversations' answers have
-- `thread` NULL; threads' have it set.
SELECT agent, channel, thread, last_seq, idle_timeout, last_activity_at, tokens_through,
       compact
FROM contextlog_append(
    %(shard)s::integer, %(epoch)s::bigint, %(last_entry_id)s, %(events)s::bigint,
    %(rebuild_lock)s::bigint, %(conversations)s::json,
    %(ids)s::uuid[], %(agents)s::text[], %(channels)s::text[], %(threads)s::text[],
    %(kinds)s::text[], %(times)s::timestamptz[], %(tokens)s::integer[],
    %(payloads)s::jsonb[], %(thread_rows)s::json, %(default_budget)s::integer,
    %(compact_at)s::double precision);

-- name: checkpoints
SELECT shard, epoch, last_entry_id, events, updated_at FROM shard_checkpoints ORDER BY shard;

-- name: events_stored
SELECT coalesce(sum(events), 0)::bigint AS stored FROM shard_checkpoints;

-- name: conversation_state
-- With the restored session (while its restore is within the rolling window: the same
-- edge as `window_messages`) and the thread's compaction summary, for the preamble.
SELECT c.cleared_seq, c.cleared_at, c.rolling_window, c.idle_timeout, c.token_budget,
       c.last_activity_at, s.session_id, s.created_at, s.summary, t.compaction_summary
FROM conversations c
LEFT JOIN sessions s
  ON s.agent = c.agent AND s.channel = c.channel AND s.session_id = c.restored_session
 AND c.restored_at >= contextlog_window_start(
         %(now)s, coalesce(c.rolling_window, %(default_window)s))
LEFT JOIN threads t
  ON t.agent = c.agent AND t.channel = c.channel AND t.thread = %(thread)s
 AND t.compacted_through_seq > 0
WHERE c.agent = %(agent)s AND c.channel = %(channel)s;

-- name: window_messages
-- The window of one thread: messages after max(last clear, rolling-window cut-off), plus
-- those of a restored session while its restore is within the rolling window, less
-- what a compaction replaced (seq <= compacted_through_seq). The cut-off is computed
-- here from the projection rows, so the reader can send this query in the same round
-- trip as `conversation_state` (pipeline mode). Two branches, each served by an index:
-- the window index by time, the (agent, channel, seq) key by the restored positions.
--
-- Cache-stable trimming (producers/context.py `trim_start` is the same rule in Python):
-- the rolling cut-off moves in steps of 1/24 of the window (`contextlog_window_start`,
-- floored, so the window reaches back up to one step further), and a window over the
-- budget starts at the first
-- row whose `before` (tokens of the window before it) reaches a multiple of the step
-- budget/2 chosen so the rest fits. The start moves only when the window grows by
-- half a budget, so one trim serves many turns; only those rows are fetched and
-- decoded (`bounded`), whatever the window's length. The window's definition and the cut
-- are `contextlog_window` and `contextlog_cut` (011), shared with `window_tail`, the read
-- from a reader's last read. Every kept row is sent, and the window's sums are found one
-- of two ways (the same sums, the same rows):
--
-- - from the running totals (migration 009: `through` on each message, the thread's
--   tokens up to it) when the window is one contiguous run of its thread's messages: its
--   first row found by one probe (`f`), its total through(last) - through(first) +
--   tokens(first), the kept part's start by a walk back from its last row over the rows
--   kept. What a first read costs follows the budget, not the window. The run is
--   contiguous unless a message after its first row is `late` and below the edge (or was
--   written without a total); the partial index on `late` answers that.
-- - otherwise (such a row; a restored session in the window; rows older than 009) the
--   whole window is summed: an index-only scan of every message's (time, seq, tokens).
WITH c AS (
    SELECT * FROM contextlog_window(%(agent)s, %(channel)s, %(thread)s, %(now)s,
                                    %(default_window)s::integer, %(default_budget)s::integer)
), r AS MATERIALIZED (
    -- Without a hint: the thread's first message at or after the rolling edge, by time
    -- (then seq): the first time by the window index, then its first row.
    SELECT e.seq, e.tokens, e.through, e.late
    FROM c CROSS JOIN LATERAL (
        SELECT e.occurred_at FROM events e
        WHERE e.agent = %(agent)s AND e.channel = %(channel)s AND e.thread = %(thread)s
          AND e.kind = 'message.v1' AND e.occurred_at >= c.cutoff
        ORDER BY e.occurred_at LIMIT 1
    ) t CROSS JOIN LATERAL (
        -- OFFSET 0: the rows of that time by the window index, not a walk along seq.
        SELECT * FROM (
            SELECT e.seq, e.tokens, e.through, e.late FROM events e
            WHERE e.agent = %(agent)s AND e.channel = %(channel)s AND e.thread = %(thread)s
              AND e.kind = 'message.v1' AND e.occurred_at = t.occurred_at
            OFFSET 0
        ) e ORDER BY e.seq LIMIT 1
    ) e
    WHERE NOT coalesce(c.restored_at >= c.cutoff, false)
), f AS MATERIALIZED (
    -- The window's first row (`seq`) and the thread's running total before it (`base`),
    -- when the window is the contiguous run of the thread's messages from that row:
    -- `r`, if it is after the clear and the compaction and no message before it is
    -- later than it (`late`: then no message of the window precedes it); or, when the
    -- clear or the compaction is the edge, the thread's first message after it, if it is
    -- within the rolling edge. And no message after it below the edge (`late` ones only
    -- can be) or without a total. No row: the window is summed (`w`).
    SELECT s.seq, s.through - s.tokens AS base
    FROM c CROSS JOIN r CROSS JOIN LATERAL (
        SELECT r.seq, r.tokens, r.through
        WHERE r.seq > greatest(c.cleared_seq, c.compacted) AND NOT r.late
        UNION ALL
        SELECT a.seq, a.tokens, a.through FROM (
            SELECT e.seq, e.tokens, e.through, e.occurred_at FROM events e
            WHERE r.seq <= greatest(c.cleared_seq, c.compacted)
              AND e.agent = %(agent)s AND e.channel = %(channel)s
              AND e.seq > greatest(c.cleared_seq, c.compacted) AND e.seq <= c.last_seq
              AND e.thread = %(thread)s AND e.kind = 'message.v1'
            ORDER BY e.seq LIMIT 1
        ) a
        WHERE a.occurred_at >= c.cutoff
    ) s
    WHERE s.through IS NOT NULL
      AND NOT EXISTS (
          -- OFFSET 0: a lookup by this row's seq, not a join over every late row.
          SELECT FROM events l
          WHERE l.agent = %(agent)s AND l.channel = %(channel)s AND l.thread = %(thread)s
            AND l.late AND l.seq > s.seq AND l.seq <= c.last_seq
            AND (l.occurred_at < c.cutoff OR l.through IS NULL)
          OFFSET 0)
), w AS (
    -- Positions and token counts only: the window's sums are taken over these, and
    -- the payload is read for the kept rows alone.
    SELECT e.seq, e.tokens
    FROM c JOIN events e
      ON e.agent = %(agent)s AND e.channel = %(channel)s AND e.thread = %(thread)s
     AND e.kind = 'message.v1' AND e.occurred_at >= c.cutoff AND e.seq > c.cleared_seq
     AND e.seq > c.compacted
    WHERE NOT EXISTS (SELECT FROM f)
    UNION ALL
    SELECT e.seq, e.tokens
    FROM c JOIN events e
      ON e.agent = %(agent)s AND e.channel = %(channel)s AND e.seq = ANY(c.restored_seqs)
     AND e.thread = %(thread)s AND e.seq > c.compacted
    WHERE c.restored_at >= c.cutoff AND NOT EXISTS (SELECT FROM f)
), cut AS MATERIALIZED (
    -- Where the kept part starts (`contextlog_cut`, 011). The newest row is always
    -- fetched: an empty answer means an empty window.
    SELECT t.total, t.last, contextlog_cut(t.total, c.budget, c.step, %(bounded)s) AS at
    FROM (SELECT coalesce(sum(tokens), 0) AS total,
                 max(seq) AS last FROM w HAVING NOT EXISTS (SELECT FROM f)
          UNION ALL
          -- From the running totals: the thread's last message ends the window.
          SELECT e.through - f.base, e.seq FROM f CROSS JOIN c CROSS JOIN LATERAL (
              SELECT e.seq, e.through FROM events e
              WHERE e.agent = %(agent)s AND e.channel = %(channel)s AND e.seq >= f.seq
                AND e.seq <= c.last_seq AND e.thread = %(thread)s AND e.kind = 'message.v1'
              ORDER BY e.seq DESC LIMIT 1
          ) e) t, c
), lo AS MATERIALIZED (
    -- From the running totals: where the kept part starts, the row after the last one
    -- whose `before` is short of the cut (`before` grows with seq), found walking back
    -- from the end over the rows kept; the last row at least.
    SELECT least(coalesce((
        SELECT p.seq + 1 FROM events p
        WHERE p.agent = %(agent)s AND p.channel = %(channel)s AND p.seq >= f.seq
          AND p.seq <= cut.last AND p.thread = %(thread)s AND p.kind = 'message.v1'
          AND p.through - p.tokens - f.base < cut.at
        ORDER BY p.seq DESC LIMIT 1), f.seq), cut.last) AS seq
    FROM f CROSS JOIN cut
), k AS MATERIALIZED (
    SELECT s.seq, s.before, s.tokens
    FROM (SELECT w.seq, w.tokens,
                 sum(w.tokens) OVER (ORDER BY w.seq ROWS UNBOUNDED PRECEDING) - w.tokens
                     AS before
          FROM w) s, cut
    WHERE s.before >= cut.at OR s.seq = cut.last
    UNION ALL
    -- From the running totals: the rows from `lo` on. The bounds as subqueries and the
    -- thread's conditions outside the fence: one range of the (agent, channel, seq) key.
    SELECT e.seq, e.through - e.tokens - (SELECT base FROM f), e.tokens
    FROM (
        SELECT e.seq, e.tokens, e.through, e.thread, e.kind FROM events e
        WHERE e.agent = %(agent)s AND e.channel = %(channel)s
          AND e.seq >= (SELECT seq FROM lo) AND e.seq <= (SELECT last FROM cut)
        OFFSET 0
    ) e
    WHERE e.thread = %(thread)s AND e.kind = 'message.v1'
)
SELECT k.seq, e.occurred_at, k.tokens, e.payload->>'role', (e.payload->'content')::text,
       k.before::bigint, c.wkey, e.event_id, cut.at::bigint
-- One lookup by key per kept row, whatever the planner estimates (LIMIT keeps the
-- subquery from being flattened into a join; MATERIALIZED above for the same reason: a
-- fresh table has no statistics, and a plan that joins first reads every payload of the
-- window, or sums the window once per row).
FROM k CROSS JOIN c CROSS JOIN cut
LEFT JOIN LATERAL (
    SELECT e.occurred_at, e.payload, e.event_id FROM events e
    WHERE e.agent = %(agent)s AND e.channel = %(channel)s AND e.seq = k.seq LIMIT 1
) e ON true
ORDER BY 1;

-- name: window_tail
-- The window of one thread read from the reader's last read of it, the bot turn's read
-- (issue 12.2: a read costs what changed, not what the window or the budget holds): the
-- reader passes the last row it returned (`hint_seq`, its event id `hint_id`, its
-- `hint_before`) and that read's `wkey` (the window's definition: edge, clear,
-- compaction, restore; and the budget, whose growth moves the kept part's start back).
-- While `wkey` is unchanged, rows up to `hint_seq` are the same rows (the log is
-- append-only and seqs only grow), the reader holds every one of them the cut can still
-- keep (the cut only moves forward), and the window's sums go on from `hint_before`: only
-- rows from `hint_seq` on are read, by the (agent, channel, seq) key, and the hint's own
-- row comes back without its payload (event_id, occurred_at, role and content NULL). The
-- reader adds its rows ahead of the hint that the cut (`at`, on every row) keeps
-- (producers/tails.py). The rows and columns of `window_messages`, in a plan a tenth its
-- size. No row: the hint is stale (another `wkey`, or its row is not the event it named:
-- a log emptied and written again may reuse a seq), and the reader reads the window with
-- `window_messages`.
WITH c AS (
    SELECT * FROM contextlog_window(%(agent)s, %(channel)s, %(thread)s, %(now)s,
                                    %(default_window)s::integer, %(default_budget)s::integer)
), w AS MATERIALIZED (
    -- The window's rows from `hint_seq` on, by the seq key (the fence, OFFSET 0, keeps the
    -- thread's other conditions out of the index choice). The range is bounded on both
    -- sides (up to the conversation's last seq): a planner that knows neither bound when
    -- planning estimates a range at a small share of the rows, where `seq >=` alone is a
    -- third, and a third of a partition one conversation fills (a small deployment) is
    -- read faster by a sequential scan: every re-read would scan the partition.
    SELECT e.seq, e.tokens, e.occurred_at, e.payload, e.event_id
    FROM c CROSS JOIN (
        SELECT e.seq, e.tokens, e.thread, e.kind, e.occurred_at, e.payload, e.event_id
        FROM events e
        WHERE e.agent = %(agent)s AND e.channel = %(channel)s
          AND e.seq >= %(hint_seq)s::bigint AND e.seq <= (SELECT last_seq FROM c)
        OFFSET 0
    ) e
    WHERE c.wkey = %(hint_key)s::text
      AND EXISTS (SELECT FROM events h
                  WHERE h.agent = %(agent)s AND h.channel = %(channel)s
                    AND h.seq = %(hint_seq)s::bigint AND h.event_id = %(hint_id)s::uuid)
      AND e.thread = %(thread)s AND e.kind = 'message.v1' AND e.seq > c.compacted
      AND ((e.occurred_at >= c.cutoff AND e.seq > c.cleared_seq)
           OR (c.restored_at >= c.cutoff AND e.seq = ANY(c.restored_seqs)))
), cut AS MATERIALIZED (
    SELECT max(w.seq) AS last,
           contextlog_cut(%(hint_before)s::bigint + sum(w.tokens), c.budget, c.step,
                          %(bounded)s) AS at
    FROM w CROSS JOIN c GROUP BY c.budget, c.step
)
SELECT s.seq, CASE WHEN s.seq > %(hint_seq)s::bigint THEN s.occurred_at END, s.tokens,
       CASE WHEN s.seq > %(hint_seq)s::bigint THEN s.payload->>'role' END,
       CASE WHEN s.seq > %(hint_seq)s::bigint THEN (s.payload->'content')::text END,
       s.before::bigint, c.wkey,
       CASE WHEN s.seq > %(hint_seq)s::bigint THEN s.event_id END, cut.at::bigint
FROM (SELECT w.*, %(hint_before)s::bigint
                  + sum(w.tokens) OVER (ORDER BY w.seq ROWS UNBOUNDED PRECEDING) - w.tokens
                      AS before
      FROM w) s CROSS JOIN c CROSS JOIN cut
WHERE s.before >= cut.at OR s.seq = cut.last
ORDER BY 1;

-- name: active_threads
-- The other threads active within the rolling window (the same edge as `window_messages`).
WITH c AS (
    SELECT contextlog_window_start(
               %(now)s, coalesce(rolling_window, %(default_window)s)) AS cutoff
    FROM conversations WHERE agent = %(agent)s AND channel = %(channel)s
)
SELECT t.thread, t.message_count, t.last_activity_at FROM c JOIN threads t
  ON t.agent = %(agent)s AND t.channel = %(channel)s AND t.thread <> %(thread)s
 AND t.last_activity_at >= c.cutoff
ORDER BY t.last_activity_at DESC LIMIT 20;

-- name: await_event
-- A row once the event is stored (how many times Postgres looked), none after
-- %(timeout)s seconds: Postgres waits (010).
SELECT looks FROM contextlog_await_event(%(event_id)s, %(agent)s, %(channel)s, %(timeout)s) looks
WHERE looks IS NOT NULL;

-- name: listen_commits
-- A reader's `wait_for` (`await_event`): woken by every ingest commit (see advance_checkpoint).
LISTEN contextlog_commits;

-- name: unlisten_commits
-- Before the connection goes back to the pool, which must not keep receiving them.
UNLISTEN contextlog_commits;

-- name: replay_events
-- The log in order, with what the fold needs; whole payloads only for commands.
SELECT agent, channel, thread, kind, occurred_at, tokens, seq,
       CASE WHEN kind = ANY(%(with_payload)s) THEN payload::text END,
       CASE WHEN kind = 'message.v1' THEN payload->>'source' END
FROM events ORDER BY position;

-- name: threads_to_compact
SELECT t.thread, t.compaction_summary, c.cleared_seq,
       coalesce(c.token_budget, %(default_budget)s)
FROM conversations c JOIN threads t ON t.agent = c.agent AND t.channel = c.channel
WHERE c.agent = %(agent)s AND c.channel = %(channel)s
  AND t.window_tokens > coalesce(c.token_budget, %(default_budget)s) * %(compact_at)s;
