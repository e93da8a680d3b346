-- Ingest's append as functions, so a bot turn's batch is one statement (issue 12.1).
--
-- A pipelined batch (a message or two) was BEGIN, four statements and COMMIT in one
-- pipeline sync: one round trip, but six messages for the client to queue and Postgres to
-- parse, bind and run, each cold after a person's think time (a one-event append took
-- 2.8 ms after a 20 ms pause against 1.8 ms for INSERT + COMMIT). `contextlog_append`
-- runs the four in order in one statement, its own transaction in autocommit mode.
--
-- Each statement is a function of its own, the one home of its SQL: the COPY path and
-- `contextlog rebuild` call them one by one (queries.sql), `contextlog_append` in a row.
-- PL/pgSQL keeps each statement's plan for the session, as a prepared statement would.
--
-- Additive and safe on a live database: functions only. A writer of the release before
-- sends the statements themselves and is unaffected.

-- The checkpoint: fencing (a writer whose lease epoch is older than the shard's last
-- committed one fails with CL001, `contextlog_fence`, 008, and its transaction is rolled
-- back; the refused upsert still locks the row, so the checkpoint stays the first lock a
-- batch takes); the rebuild lock taken shared (`contextlog rebuild` holds it exclusively
-- while it replays the log); and a NOTIFY on `contextlog_commits`, delivered only when the
-- batch commits, which wakes a reader waiting for an event (010).
CREATE OR REPLACE FUNCTION contextlog_advance_checkpoint(
    p_shard integer, p_epoch bigint, p_last_entry_id text, p_events bigint,
    p_rebuild_lock bigint)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(p_rebuild_lock);
    PERFORM pg_notify('contextlog_commits', '');
    INSERT INTO shard_checkpoints AS s (shard, epoch, last_entry_id, events, updated_at)
    VALUES (p_shard, p_epoch, p_last_entry_id, p_events, now())
    ON CONFLICT (shard) DO UPDATE
        SET epoch = EXCLUDED.epoch,
            last_entry_id = EXCLUDED.last_entry_id,
            events = s.events + EXCLUDED.events,
            updated_at = now()
        WHERE s.epoch <= EXCLUDED.epoch;
    PERFORM contextlog_fence(p_shard, p_epoch, FOUND);
END
$$;

-- Reserves `n` sequence numbers per conversation and folds in the batch's projection
-- changes; returns the new last seq, and the idle timer's inputs. Rows come as one JSON
-- document (encoded by msgspec): far cheaper to send than nine parameter arrays, which
-- psycopg dumps element by element in Python. `cleared` and `message` are offsets within
-- the batch (0: none), so the clear's seq is the old last_seq plus its offset. The
-- upsert's row lock is what serialises two writers of one conversation.
CREATE OR REPLACE FUNCTION contextlog_advance_conversations(p_rows json)
RETURNS TABLE (agent text, channel text, last_seq bigint, idle_timeout integer,
               last_activity_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO conversations AS c (agent, channel, last_seq, cleared_seq, cleared_at,
                                    rolling_window, idle_timeout, token_budget,
                                    last_activity_at, last_message_seq, source)
    SELECT x.agent, x.channel, x.n, x.cleared, x.cleared_at, x.rolling_window,
           x.idle_timeout, x.token_budget, x.activity, x.message, x.source
    FROM json_to_recordset(p_rows) AS x(
        agent text, channel text, n bigint, cleared bigint, cleared_at timestamptz,
        rolling_window integer, idle_timeout integer, token_budget integer,
        activity timestamptz, message bigint, source text)
    ON CONFLICT (agent, channel) DO UPDATE SET
        last_seq = c.last_seq + EXCLUDED.last_seq,
        cleared_seq = CASE WHEN EXCLUDED.cleared_seq > 0 THEN c.last_seq + EXCLUDED.cleared_seq
                           ELSE c.cleared_seq END,
        cleared_at = CASE WHEN EXCLUDED.cleared_seq > 0 THEN EXCLUDED.cleared_at
                          ELSE c.cleared_at END,
        rolling_window = coalesce(EXCLUDED.rolling_window, c.rolling_window),
        idle_timeout = coalesce(EXCLUDED.idle_timeout, c.idle_timeout),
        token_budget = coalesce(EXCLUDED.token_budget, c.token_budget),
        last_activity_at = greatest(c.last_activity_at, EXCLUDED.last_activity_at),
        last_message_seq = CASE WHEN EXCLUDED.last_message_seq > 0
                                THEN c.last_seq + EXCLUDED.last_message_seq
                                ELSE c.last_message_seq END,
        source = coalesce(EXCLUDED.source, c.source)
    RETURNING c.agent, c.channel, c.last_seq, c.idle_timeout, c.last_activity_at;
END
$$;

-- The rows of a batch small enough to travel as parameters (COPY takes the others),
-- numbered here: `contextlog_advance_conversations` ran before this in the same
-- transaction, so `last_seq` is already the conversation's new last seq, and its k-th row
-- of the batch (in order) gets last_seq - n + k, where n is how many rows it has here, the
-- count it was advanced by (such a batch is one round: every row is here). A conversation
-- row missing would leave seq NULL, which the column refuses: a loud failure, not a
-- dropped row. `threads` still holds each thread's running total and latest time before
-- the batch (`contextlog_advance_threads` runs after this), which `through` and `late`
-- of its messages go on from (migration 009; its other rows: NULL and false, as
-- `copy_events` writes them). ORDER BY: positions (the identity) are taken in the order
-- the rows come, as COPY takes them.
CREATE OR REPLACE FUNCTION contextlog_insert_events(
    p_ids uuid[], p_agents text[], p_channels text[], p_threads text[], p_kinds text[],
    p_times timestamptz[], p_tokens integer[], p_payloads jsonb[])
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO events (event_id, agent, channel, thread, seq, kind, occurred_at, tokens,
                        through, late, payload)
    SELECT x.event_id, x.agent, x.channel, x.thread,
           c.last_seq - count(*) OVER conv + row_number() OVER (conv ORDER BY x.k),
           x.kind, x.occurred_at, x.tokens,
           CASE WHEN x.kind = 'message.v1' THEN coalesce(t.tokens_through, 0)
                     + sum(x.tokens) FILTER (WHERE x.kind = 'message.v1')
                       OVER (thread ORDER BY x.k)
           END,
           x.kind = 'message.v1' AND coalesce(x.occurred_at < greatest(
               t.last_activity_at,
               max(x.occurred_at) FILTER (WHERE x.kind = 'message.v1') OVER (
                   thread ORDER BY x.k ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)),
               false),
           x.payload
    FROM unnest(p_ids, p_agents, p_channels, p_threads, p_kinds, p_times, p_tokens, p_payloads)
         WITH ORDINALITY AS x(event_id, agent, channel, thread, kind, occurred_at, tokens,
                              payload, k)
    LEFT JOIN conversations c ON c.agent = x.agent AND c.channel = x.channel
    LEFT JOIN threads t ON t.agent = x.agent AND t.channel = x.channel
                       AND t.thread = x.thread
    WINDOW conv AS (PARTITION BY x.agent, x.channel),
           thread AS (PARTITION BY x.agent, x.channel, x.thread)
    ORDER BY x.k;
END
$$;

-- One row per thread of the batch: its running token total and latest message time before
-- the batch (`events.through` and `late` of the batch's rows go on from them; NULL for a
-- new thread), and whether its window passed `compact_at` of the token budget (the
-- conversation is a compaction candidate; the conversations were updated before, so the
-- join sees this batch's settings). The outer query reads `threads` as the statement
-- found it, before `up`: every part of a statement sees the same snapshot. That read is a
-- join with the table (one index probe a thread), not with a CTE of it: two CTEs have no
-- index and the planner, which expects few rows from either, joined them by a nested
-- loop, quadratic in the batch's threads (~30 ms at 500 threads).
CREATE OR REPLACE FUNCTION contextlog_advance_threads(
    p_rows json, default_budget integer, compact_at double precision)
RETURNS TABLE (agent text, channel text, thread text, tokens_through bigint,
               last_activity_at timestamptz, compact boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH x AS MATERIALIZED (
        SELECT * FROM json_to_recordset(p_rows) AS x(
            agent text, channel text, thread text, n bigint, tokens bigint,
            activity timestamptz)
    ), up AS (
        INSERT INTO threads AS t (agent, channel, thread, message_count, last_activity_at,
                                  window_tokens, tokens_through)
        SELECT x.agent, x.channel, x.thread, x.n, x.activity, x.tokens, x.tokens FROM x
        ON CONFLICT (agent, channel, thread) DO UPDATE SET
            message_count = t.message_count + EXCLUDED.message_count,
            last_activity_at = greatest(t.last_activity_at, EXCLUDED.last_activity_at),
            window_tokens = t.window_tokens + EXCLUDED.window_tokens,
            tokens_through = t.tokens_through + EXCLUDED.tokens_through
        RETURNING t.agent, t.channel, t.thread, t.window_tokens
    )
    SELECT up.agent, up.channel, up.thread, b.tokens_through, b.last_activity_at,
           up.window_tokens > coalesce(c.token_budget, default_budget) * compact_at
    FROM up JOIN conversations c ON c.agent = up.agent AND c.channel = up.channel
    LEFT JOIN threads b ON b.agent = up.agent AND b.channel = up.channel
                       AND b.thread = up.thread;
END
$$;

-- A batch of messages that fits in parameters, whole: the checkpoint, the conversations,
-- the rows and the threads, in the order (and with the locks) of the COPY path. One
-- statement: sent in autocommit mode it is its own transaction, and any failure (the
-- fence, a duplicate event id) rolls all of it back. Returns the conversations' answers
-- (`thread` NULL) and the threads' (`thread` set), as the two functions give them.
CREATE OR REPLACE FUNCTION contextlog_append(
    p_shard integer, p_epoch bigint, p_last_entry_id text, p_events bigint,
    p_rebuild_lock bigint, p_conversations json,
    p_ids uuid[], p_agents text[], p_channels text[], p_threads text[], p_kinds text[],
    p_times timestamptz[], p_tokens integer[], p_payloads jsonb[],
    p_thread_rows json, default_budget integer, compact_at double precision)
RETURNS TABLE (agent text, channel text, thread text, last_seq bigint,
               idle_timeout integer, last_activity_at timestamptz, tokens_through bigint,
               compact boolean)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM contextlog_advance_checkpoint(
        p_shard, p_epoch, p_last_entry_id, p_events, p_rebuild_lock);
    RETURN QUERY
    SELECT a.agent, a.channel, NULL::text, a.last_seq, a.idle_timeout, a.last_activity_at,
           NULL::bigint, NULL::boolean
    FROM contextlog_advance_conversations(p_conversations) AS a;
    PERFORM contextlog_insert_events(
        p_ids, p_agents, p_channels, p_threads, p_kinds, p_times, p_tokens, p_payloads);
    RETURN QUERY
    SELECT t.agent, t.channel, t.thread, NULL::bigint, NULL::integer, t.last_activity_at,
           t.tokens_through, t.compact
    FROM contextlog_advance_threads(p_thread_rows, default_budget, compact_at) AS t;
END
$$;
