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
-- Sequence numbers reserved, the batch's projection changes folded in and its recorded
-- time set: see `contextlog_advance_conversations_v2` (014).
SELECT agent, channel, last_seq, idle_timeout, last_activity_at, recorded_at
FROM contextlog_advance_conversations_v2(%(conversations)s::json);

-- name: advance_threads
-- Running totals (the batch's rows go on from the ones answered): see
-- `contextlog_advance_threads` (012); its `compact` is `advance_segments`' now.
SELECT agent, channel, thread, tokens_through, last_activity_at
FROM contextlog_advance_threads(%(thread_rows)s::json, %(default_budget)s::integer,
                                %(compact_at)s::double precision);

-- name: advance_segments
-- The boundary decisions, once the batch's rows are written, and the compaction
-- candidates: see `contextlog_advance_segments` (014).
SELECT agent, channel, thread, compact
FROM contextlog_advance_segments(%(thread_rows)s::json, %(default_budget)s::integer,
                                 %(compact_at)s::double precision,
                                 %(default_window)s::integer,
                                 %(cut_at)s::double precision,
                                 %(edge_step)s::double precision);

-- name: copy_events
-- `through` and `late`: see migration 009 (commands: NULL and false).
COPY events (event_id, agent, channel, thread, seq, kind, occurred_at, tokens, through,
             late, mark, recorded_at, payload)
FROM STDIN;

-- name: append_messages
-- A batch small enough to travel as parameters, whole, in one statement (run in autocommit
-- mode, its own transaction): see `contextlog_append_v2` (014). Conversations' answers
-- have `thread` NULL; threads' have it set.
SELECT agent, channel, thread, last_seq, idle_timeout, last_activity_at, tokens_through,
       compact
FROM contextlog_append_v2(
    %(shard)s::integer, %(epoch)s::bigint, %(last_entry_id)s, %(events)s::bigint,
    %(rebuild_lock)s::bigint, %(conversations)s::json,
    %(ids)s::uuid[], %(agents)s::text[], %(channels)s::text[], %(threads)s::text[],
    %(kinds)s::text[], %(times)s::timestamptz[], %(tokens)s::integer[],
    %(payloads)s::jsonb[], %(marks)s::smallint[], %(thread_rows)s::json,
    %(default_budget)s::integer, %(compact_at)s::double precision,
    %(default_window)s::integer, %(cut_at)s::double precision,
    %(edge_step)s::double precision);

-- name: checkpoints
SELECT shard, epoch, last_entry_id, events, updated_at FROM shard_checkpoints ORDER BY shard;

-- name: events_stored
SELECT coalesce(sum(events), 0)::bigint AS stored FROM shard_checkpoints;

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
-- The log in order, with what the fold needs; whole payloads only for commands. A message
-- stored without a mark (before 014) gets the one ingest would give it now.
SELECT agent, channel, thread, kind, recorded_at, tokens, seq,
       CASE WHEN kind = ANY(%(with_payload)s) THEN payload::text END,
       CASE WHEN kind = 'message.v1' THEN payload->>'source' END,
       coalesce(mark, contextlog_mark_of(kind, payload))
FROM events ORDER BY position;

-- name: threads_to_compact
-- Threads whose segment passed the compaction threshold with no summary of ours waiting
-- to land, and their summary so far.
SELECT t.thread, t.seg_summary
FROM conversations c JOIN threads t ON t.agent = c.agent AND t.channel = c.channel
WHERE c.agent = %(agent)s AND c.channel = %(channel)s AND t.pending_summary IS NULL
  AND t.window_tokens > coalesce(c.token_budget, %(default_budget)s) * %(compact_at)s
ORDER BY t.thread;

-- name: conversation_settings
-- A conversation's own settings (NULL: the deployment's default).
SELECT rolling_window, idle_timeout, token_budget FROM conversations
WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: signing_key
-- The results' signing key: %(value)s becomes it unless another process made it first.
WITH made AS (
    INSERT INTO contextlog_secrets (name, value) VALUES ('results', %(value)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING value
)
SELECT value FROM made
UNION ALL
SELECT value FROM contextlog_secrets WHERE name = 'results' AND NOT EXISTS (SELECT FROM made);
