-- Append-only contexts between boundaries (issue 29; docs/context.md is the contract).
--
-- A thread's context used to be computed by every read from `now`: the rolling edge and
-- the budget's cut moved with the clock and with each new message, the thinking of
-- finished turns was left out, and our additions were rebuilt into `system`. Claude's
-- newest models bind every thinking block to its prefix (system, tools, every earlier
-- message), so each of those moves made a request the API refuses, or lost reasoning.
--
-- Now a thread's context is a *segment*: from `seg_start` on, its messages in log order,
-- each as posted, behind a header frozen when the segment began. Reads only ever see it
-- grow at its end. It changes anywhere else only at a boundary, decided here by ingest
-- (in the batch's transaction, so `contextlog rebuild` replays the same decisions):
--
-- - at an *opening* user message (one that answers no tool call: `events.mark` 1), when
--   the segment passed `cut_at` of the token budget, or its first message is older than
--   the rolling window: the start moves to a later opening message, in steps (half a
--   budget; a quarter of the window), so a busy thread crosses few boundaries a day;
--   our own summary of the older part (a compaction job's, `pending_summary`) lands here
--   too. Thinking in the messages kept from before that message is removed
--   (`strip_through`): its prefix changed. The cycle the message opens keeps its own.
-- - at an assistant message that holds the API's `compaction` block (`mark` 2): the
--   context starts there, and nothing before it is sent (the API ignores it).
-- - by the command handlers: clear, restore, the worker's API compaction (a block that
--   replaces exactly the messages it summarised: kept thinking stays valid), a new frame.
--
-- `events.recorded_at` is the authoritative time of an event: ingest writes its own
-- clock there (monotone per conversation, `conversations.recorded_at`), never a
-- producer's; rows of older writers keep the database's `now()`, the column's default.
--
-- Additive: new columns (no rewrite), a table, new functions beside 012's (a writer of
-- the release before calls those and is unaffected). Existing threads get a segment
-- from their state: the rolling window as of now and the compaction they had.

ALTER TABLE events ADD COLUMN IF NOT EXISTS mark smallint;

ALTER TABLE conversations
    ADD COLUMN IF NOT EXISTS recorded_at timestamptz,
    ADD COLUMN IF NOT EXISTS frame jsonb,
    ADD COLUMN IF NOT EXISTS frame_seq bigint;

ALTER TABLE threads
    ADD COLUMN IF NOT EXISTS seg_start bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS seg_base bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS seg_at timestamptz,
    ADD COLUMN IF NOT EXISTS seg_extra bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS seg_restored bigint[],
    ADD COLUMN IF NOT EXISTS seg_note text,
    ADD COLUMN IF NOT EXISTS note_session text,
    ADD COLUMN IF NOT EXISTS seg_summary text,
    ADD COLUMN IF NOT EXISTS seg_threads text[],
    ADD COLUMN IF NOT EXISTS seg_block jsonb,
    ADD COLUMN IF NOT EXISTS strip_through bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS boundaries bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS boundary text,
    ADD COLUMN IF NOT EXISTS boundary_seq bigint,
    ADD COLUMN IF NOT EXISTS pending_summary text,
    ADD COLUMN IF NOT EXISTS pending_through bigint;

-- Our own system notes, appended to a thread's context at the log position where what
-- they tell happened (a resumed session's summary that landed after the restore).
CREATE TABLE IF NOT EXISTS notes (
    agent   text   NOT NULL,
    channel text   NOT NULL,
    thread  text   NOT NULL,
    seq     bigint NOT NULL,
    text    text   NOT NULL,
    PRIMARY KEY (agent, channel, thread, seq)
);

-- The first seq at or after `lo` of a conversation recorded at or after `at` (its last
-- seq + 1 when none): recorded times never go back within a conversation, so a binary
-- search over the (agent, channel, seq) key finds it in ~log2(n) probes, however long
-- the conversation (a save's window, the rolling edge).
CREATE OR REPLACE FUNCTION contextlog_seq_at(
    p_agent text, p_channel text, at timestamptz, lo bigint)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    hi bigint;
    mid bigint;
    found_seq bigint;
    found_at timestamptz;
BEGIN
    SELECT c.last_seq + 1 INTO hi FROM conversations c
    WHERE c.agent = p_agent AND c.channel = p_channel;
    IF hi IS NULL THEN
        RETURN lo;
    END IF;
    WHILE lo < hi LOOP
        mid := lo + (hi - lo) / 2;
        SELECT e.seq, e.recorded_at INTO found_seq, found_at FROM events e
        WHERE e.agent = p_agent AND e.channel = p_channel AND e.seq >= mid AND e.seq < hi
        ORDER BY e.seq LIMIT 1;
        IF found_seq IS NULL THEN
            hi := mid;  -- a gap up to hi (retention removed those rows)
        ELSIF found_at >= at THEN
            hi := found_seq;
        ELSE
            lo := found_seq + 1;
        END IF;
        found_seq := NULL;
    END LOOP;
    RETURN lo;
END
$$;

-- The mark of a message stored before 014 (or by a writer that wrote none), from its
-- payload: what `rows.mark_of` gives a message ingest stores now (1: a user message that
-- answers no tool call and holds something; 2: an assistant message holding the API's
-- compaction block with a summary). A test holds the two to one another.
CREATE OR REPLACE FUNCTION contextlog_mark_of(kind text, payload jsonb)
RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN kind <> 'message.v1' THEN NULL
        WHEN payload->>'role' = 'user' AND jsonb_typeof(payload->'content') = 'string' THEN
            CASE WHEN payload->>'content' ~ '[^[:space:]]' THEN 1 END
        WHEN payload->>'role' = 'user' THEN
            CASE WHEN NOT jsonb_path_exists(payload->'content',
                                            '$[*] ? (@.type == "tool_result")')
                      AND jsonb_path_exists(payload->'content',
                          '$[*] ? (@.type != "text" || @.text like_regex "[^[:space:]]")')
                 THEN 1 END
        WHEN payload->>'role' = 'assistant' AND jsonb_typeof(payload->'content') = 'array'
             AND jsonb_path_exists(payload->'content',
                 '$[*] ? (@.type == "compaction" && (@.content != null || @.encrypted_content != null))')
             THEN 2
    END::smallint
$$;

-- The header's share of a segment's tokens (~4 characters a token, as everywhere).
CREATE OR REPLACE FUNCTION contextlog_header_tokens(note text, summary text, threads text[])
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ((coalesce(length(note), 0) + coalesce(length(summary), 0)
             + coalesce(length(array_to_string(threads, ' ')) + 48, 0)) / 4)::bigint
$$;

-- The other threads of a conversation active within `win` seconds before `at`: the
-- header's thread list, frozen at a boundary.
CREATE OR REPLACE FUNCTION contextlog_threads_at(
    p_agent text, p_channel text, p_thread text, at timestamptz, win integer)
RETURNS text[] LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT nullif(array(
        SELECT t.thread FROM threads t
        WHERE t.agent = p_agent AND t.channel = p_channel AND t.thread <> p_thread
          AND t.last_activity_at >= at - make_interval(secs => win)
        ORDER BY t.thread LIMIT 20), '{}')
$$;

-- The conversations' changes of a batch (012's `contextlog_advance_conversations`) with
-- the batch's time: each row's `at` (the ingest's clock; a rebuild: the recorded times it
-- replays) moved up to the conversation's last batch time when the clock is behind it (a
-- clock stepped back, another host's ingest after a failover), so recorded times never
-- go back within a conversation.
CREATE OR REPLACE FUNCTION contextlog_advance_conversations_v2(p_rows json)
RETURNS TABLE (agent text, channel text, last_seq bigint, idle_timeout integer,
               last_activity_at timestamptz, recorded_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO conversations AS c (agent, channel, last_seq, cleared_seq, cleared_at,
                                    rolling_window, idle_timeout, token_budget,
                                    last_activity_at, last_message_seq, source, recorded_at)
    SELECT x.agent, x.channel, x.n, x.cleared, x.cleared_at, x.rolling_window,
           x.idle_timeout, x.token_budget, x.activity, x.message, x.source,
           coalesce(x.at, now())
    FROM json_to_recordset(p_rows) AS x(
        agent text, channel text, n bigint, cleared bigint, cleared_at timestamptz,
        rolling_window integer, idle_timeout integer, token_budget integer,
        activity timestamptz, message bigint, source text, at timestamptz)
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
        source = coalesce(EXCLUDED.source, c.source),
        recorded_at = greatest(c.recorded_at, EXCLUDED.recorded_at)
    RETURNING c.agent, c.channel, c.last_seq, c.idle_timeout, c.last_activity_at,
              c.recorded_at;
END
$$;

-- 012's `contextlog_insert_events` with each row's mark and the batch time of its
-- conversation (`conversations.recorded_at`, set by the statement before); `late` is
-- false (nothing reads it since the reads by time went).
CREATE OR REPLACE FUNCTION contextlog_insert_events_v2(
    p_ids uuid[], p_agents text[], p_channels text[], p_threads text[], p_kinds text[],
    p_times timestamptz[], p_tokens integer[], p_payloads jsonb[], p_marks smallint[])
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO events (event_id, agent, channel, thread, seq, kind, occurred_at, tokens,
                        through, late, payload, mark, recorded_at)
    SELECT x.event_id, x.agent, x.channel, x.thread,
           c.last_seq - count(*) OVER conv + row_number() OVER (conv ORDER BY x.k),
           x.kind, x.occurred_at, x.tokens,
           CASE WHEN x.kind = 'message.v1' THEN coalesce(t.tokens_through, 0)
                     + sum(x.tokens) FILTER (WHERE x.kind = 'message.v1')
                       OVER (thread ORDER BY x.k)
           END,
           false,  -- `late` (009) served the reads by time before 014; none reads it now
           x.payload, x.mark, coalesce(c.recorded_at, now())
    FROM unnest(p_ids, p_agents, p_channels, p_threads, p_kinds, p_times, p_tokens, p_payloads,
                p_marks)
         WITH ORDINALITY AS x(event_id, agent, channel, thread, kind, occurred_at, tokens,
                              payload, mark, k)
    LEFT JOIN conversations c ON c.agent = x.agent AND c.channel = x.channel
    LEFT JOIN threads t ON t.agent = x.agent AND t.channel = x.channel
                       AND t.thread = x.thread
    WINDOW conv AS (PARTITION BY x.agent, x.channel),
           thread AS (PARTITION BY x.agent, x.channel, x.thread)
    ORDER BY x.k;
END
$$;

-- Whether the user message at `p_seq` starts a user turn that closes a tool-use cycle as
-- the API sees it: the user messages merged with it before it answer no tool call, and
-- the assistant turn before them calls no tool (else results may still come and join the
-- turn: the cycle would go on, and its thinking must not be removed). A few rows read
-- back from the message, by the key.
CREATE OR REPLACE FUNCTION contextlog_closes_cycle(
    p_agent text, p_channel text, p_thread text, p_seq bigint)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
    answered boolean := false;
BEGIN
    FOR r IN
        SELECT e.payload->>'role' AS role, e.payload->'content' AS content FROM events e
        WHERE e.agent = p_agent AND e.channel = p_channel AND e.seq < p_seq
          AND e.thread = p_thread AND e.kind = 'message.v1'
        ORDER BY e.seq DESC
    LOOP
        CONTINUE WHEN r.role = 'system';
        IF r.role = 'user' THEN
            IF answered THEN
                RETURN true;  -- the assistant turn before ended on a user turn
            END IF;
            IF jsonb_typeof(r.content) = 'array'
               AND jsonb_path_exists(r.content, '$[*] ? (@.type == "tool_result")') THEN
                RETURN false;
            END IF;
            CONTINUE;
        END IF;
        IF jsonb_typeof(r.content) = 'array'
           AND jsonb_path_exists(r.content, '$[*] ? (@.type == "tool_use")') THEN
            RETURN false;
        END IF;
        answered := true;  -- an assistant message without a call: look on for its turn
    END LOOP;
    RETURN true;
END
$$;

-- A segment's start moved to message `s` (seq, tokens before it in the thread, time) at a
-- boundary of `kind` decided at seq `at_seq`: what every such move sets.
CREATE OR REPLACE FUNCTION contextlog_move_start(
    t threads, s_seq bigint, s_base bigint, s_at timestamptz, kind text, at_seq bigint,
    strip bigint)
RETURNS threads LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    t.seg_start := s_seq;
    t.seg_base := s_base;
    t.seg_at := s_at;
    t.seg_restored := NULL;
    t.strip_through := greatest(t.strip_through, strip);
    t.boundaries := t.boundaries + 1;
    t.boundary := kind;
    t.boundary_seq := at_seq;
    RETURN t;
END
$$;

-- The boundary decisions of one thread for the batch's marked messages, in log order (a
-- batch of any size decides as a batch of one would: rebuild equals live ingest). `r`:
-- the thread's row after the batch's running totals; the messages are read back from
-- `events` (this transaction wrote them). Returns the row to store.
CREATE OR REPLACE FUNCTION contextlog_segment_steps(
    t threads, lo bigint, hi bigint, budget integer, win integer,
    cut_at double precision, edge_step double precision)
RETURNS threads LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    m record;
    s record;
    total bigint;
    step bigint := greatest(1, budget / 2);
    over boolean;
    edge boolean;
    target bigint;
    not_before timestamptz;
BEGIN
    IF t.seg_at IS NULL THEN  -- a new thread: its segment starts at its first message
        SELECT e.recorded_at INTO t.seg_at FROM events e
        WHERE e.agent = t.agent AND e.channel = t.channel AND e.seq >= t.seg_start
          AND e.thread = t.thread AND e.kind = 'message.v1'
        ORDER BY e.seq LIMIT 1;
    END IF;
    FOR m IN
        SELECT e.seq, e.tokens, e.through, e.recorded_at, e.mark FROM events e
        WHERE e.agent = t.agent AND e.channel = t.channel AND e.seq >= lo AND e.seq <= hi
          AND e.thread = t.thread AND e.kind = 'message.v1' AND e.mark IS NOT NULL
        ORDER BY e.seq
    LOOP
        IF m.seq < t.seg_start THEN
            CONTINUE;  -- a clear or restore of this batch came after it
        END IF;
        IF m.mark = 2 THEN
            -- The API's compaction block: the context starts at this assistant message and
            -- keeps all thinking (the API wrote the summary; its prefix starts at the block).
            t := contextlog_move_start(t, m.seq, m.through - m.tokens, m.recorded_at,
                                       'compaction', m.seq, 0);
            t.seg_block := NULL;
            t.pending_summary := NULL;
            t.pending_through := NULL;
            t.seg_extra := contextlog_header_tokens(t.seg_note, t.seg_summary, t.seg_threads);
            CONTINUE;
        END IF;
        IF (t.pending_summary IS NULL OR t.pending_through >= m.seq)
           AND m.through - t.seg_base + t.seg_extra <= cut_at * budget
           AND NOT (t.seg_at IS NOT NULL
                    AND t.seg_at < m.recorded_at - make_interval(secs => win)) THEN
            CONTINUE;  -- nothing to decide here (the usual case: no row read)
        END IF;
        IF NOT contextlog_closes_cycle(t.agent, t.channel, t.thread, m.seq) THEN
            CONTINUE;  -- a cycle may go on through this turn: the next opening message
        END IF;
        IF t.pending_summary IS NOT NULL AND t.pending_through < m.seq THEN
            -- Our summary of the older part lands at the first opening message after it
            -- (never inside a tool-use cycle, whose thinking the API wants back).
            SELECT e.seq, e.through - e.tokens AS base, e.recorded_at INTO s FROM events e
            WHERE e.agent = t.agent AND e.channel = t.channel AND e.seq > t.pending_through
              AND e.seq <= m.seq AND e.thread = t.thread AND e.kind = 'message.v1'
            ORDER BY e.seq LIMIT 1;
            t := contextlog_move_start(t, s.seq, s.base, s.recorded_at, 'summary', m.seq,
                                       m.seq - 1);
            t.seg_summary := t.pending_summary;
            t.seg_block := NULL;
            t.pending_summary := NULL;
            t.pending_through := NULL;
            t.seg_extra := contextlog_header_tokens(t.seg_note, t.seg_summary, t.seg_threads);
        END IF;
        total := m.through - t.seg_base + t.seg_extra;
        over := total > cut_at * budget;
        edge := t.seg_at IS NOT NULL AND t.seg_at < m.recorded_at - make_interval(secs => win);
        IF NOT (over OR edge) THEN
            CONTINUE;
        END IF;
        target := t.seg_base;
        IF over THEN
            target := target + ceil((total - cut_at * budget) / step)::bigint * step;
        END IF;
        not_before := '-infinity';
        IF edge THEN
            not_before := m.recorded_at - make_interval(secs => win)
                          + make_interval(secs => (win * edge_step)::integer);
        END IF;
        -- The first opening message at or after both cuts; the message itself at worst
        -- (its exchange alone). Rows of writers before 014 carry no mark: a user message
        -- without a tool result opens an exchange there.
        SELECT e.seq, e.through - e.tokens AS base, e.recorded_at INTO s FROM events e
        WHERE e.agent = t.agent AND e.channel = t.channel AND e.seq >= t.seg_start
          AND e.seq <= m.seq AND e.thread = t.thread AND e.kind = 'message.v1'
          AND coalesce(e.mark, contextlog_mark_of(e.kind, e.payload)) = 1
          AND e.through - e.tokens >= target AND e.recorded_at >= not_before
        ORDER BY e.seq LIMIT 1;
        IF NOT FOUND THEN
            SELECT m.seq AS seq, m.through - m.tokens AS base, m.recorded_at AS recorded_at
            INTO s;
        END IF;
        t := contextlog_move_start(t, s.seq, s.base, s.recorded_at,
                                   CASE WHEN over THEN 'budget' ELSE 'edge' END, m.seq,
                                   m.seq - 1);
        t.seg_threads := contextlog_threads_at(t.agent, t.channel, t.thread, m.recorded_at, win);
        t.seg_extra := contextlog_header_tokens(t.seg_note, t.seg_summary, t.seg_threads)
                       + coalesce(length(t.seg_block->>'content') / 4, 0);
    END LOOP;
    t.window_tokens := t.tokens_through - t.seg_base + t.seg_extra;
    RETURN t;
END
$$;

-- The boundary decisions of the threads the batch gave a marked message (`marks` > 0 in
-- their row; `conv_n`: their conversation's events in the batch, so the batch's seqs are
-- last_seq - conv_n + 1 .. last_seq), once the batch's rows and running totals are
-- written (012's `contextlog_advance_threads`). Returns, for every thread of the batch,
-- whether its segment passed `compact_at` of its budget with no summary of ours waiting
-- to land: a compaction candidate.
CREATE OR REPLACE FUNCTION contextlog_advance_segments(
    p_rows json, default_budget integer, compact_at double precision,
    default_window integer, cut_at double precision, edge_step double precision)
RETURNS TABLE (agent text, channel text, thread text, compact boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    x record;
    t threads;
BEGIN
    FOR x IN
        SELECT r.agent, r.channel, r.thread, c.last_seq - r.conv_n + 1 AS lo, c.last_seq AS hi,
               coalesce(c.token_budget, default_budget) AS budget,
               coalesce(c.rolling_window, default_window) AS win
        FROM json_to_recordset(p_rows) AS r(
            agent text, channel text, thread text, conv_n bigint, marks integer)
        JOIN conversations c ON c.agent = r.agent AND c.channel = r.channel
        WHERE r.marks > 0
        ORDER BY 1, 2, 3
    LOOP
        SELECT * INTO t FROM threads h
        WHERE h.agent = x.agent AND h.channel = x.channel AND h.thread = x.thread;
        t := contextlog_segment_steps(t, x.lo, x.hi, x.budget, x.win, cut_at, edge_step);
        UPDATE threads h SET
            seg_start = t.seg_start, seg_base = t.seg_base, seg_at = t.seg_at,
            seg_extra = t.seg_extra, seg_restored = t.seg_restored, seg_summary = t.seg_summary,
            seg_threads = t.seg_threads, seg_block = t.seg_block,
            strip_through = t.strip_through, boundaries = t.boundaries, boundary = t.boundary,
            boundary_seq = t.boundary_seq, pending_summary = t.pending_summary,
            pending_through = t.pending_through, window_tokens = t.window_tokens
        WHERE h.agent = x.agent AND h.channel = x.channel AND h.thread = x.thread;
    END LOOP;
    RETURN QUERY
    SELECT h.agent, h.channel, h.thread,
           h.window_tokens > coalesce(c.token_budget, default_budget) * compact_at
           AND h.pending_summary IS NULL
    FROM json_to_recordset(p_rows) AS r(agent text, channel text, thread text)
    JOIN threads h ON h.agent = r.agent AND h.channel = r.channel AND h.thread = r.thread
    JOIN conversations c ON c.agent = h.agent AND c.channel = h.channel;
END
$$;

-- 012's `contextlog_append` with the batch's time, the rows' marks and the boundary
-- decisions.
CREATE OR REPLACE FUNCTION contextlog_append_v2(
    p_shard integer, p_epoch bigint, p_last_entry_id text, p_events bigint,
    p_rebuild_lock bigint, p_conversations json,
    p_ids uuid[], p_agents text[], p_channels text[], p_threads text[], p_kinds text[],
    p_times timestamptz[], p_tokens integer[], p_payloads jsonb[], p_marks smallint[],
    p_thread_rows json, default_budget integer, compact_at double precision,
    default_window integer, cut_at double precision, edge_step double precision)
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
    FROM contextlog_advance_conversations_v2(p_conversations) AS a;
    PERFORM contextlog_insert_events_v2(
        p_ids, p_agents, p_channels, p_threads, p_kinds, p_times, p_tokens, p_payloads,
        p_marks);
    RETURN QUERY
    SELECT t.agent, t.channel, t.thread, NULL::bigint, NULL::integer, t.last_activity_at,
           t.tokens_through, s.compact
    FROM contextlog_advance_threads(p_thread_rows, default_budget, compact_at) AS t
    JOIN contextlog_advance_segments(p_thread_rows, default_budget, compact_at,
                                     default_window, cut_at, edge_step) AS s
      ON s.agent = t.agent AND s.channel = t.channel AND s.thread = t.thread;
END
$$;

-- Existing threads: the segment of the window as the reads before this release computed
-- it at this moment (the default window of 24 h where a conversation set none), after the
-- last clear and compaction, with a restored session's messages while its restore is in
-- the window; their compaction summary becomes the header's. The budget is applied at
-- each thread's next opening message.
WITH s AS (
    SELECT t.agent, t.channel, t.thread, c.last_seq, t.tokens_through, f.seq, f.base,
           f.occurred_at,
           CASE WHEN c.restored_at >= now() - make_interval(
                         secs => coalesce(c.rolling_window, 86400))
                THEN c.restored_at END AS restored_at,
           c.restored_seqs
    FROM threads t JOIN conversations c ON c.agent = t.agent AND c.channel = t.channel
    LEFT JOIN LATERAL (
        SELECT e.seq, coalesce(e.through - e.tokens, 0) AS base, e.occurred_at FROM events e
        WHERE e.agent = t.agent AND e.channel = t.channel AND e.thread = t.thread
          AND e.kind = 'message.v1'
          AND e.occurred_at >= now() - make_interval(secs => coalesce(c.rolling_window, 86400))
          AND e.seq > greatest(c.cleared_seq, t.compacted_through_seq)
        ORDER BY e.occurred_at, e.seq LIMIT 1
    ) f ON true
)
UPDATE threads t SET
    seg_start = coalesce(s.seq, s.last_seq + 1),
    seg_base = coalesce(s.base, s.tokens_through),
    seg_at = coalesce(s.restored_at, s.occurred_at),
    seg_restored = CASE WHEN s.restored_at IS NOT NULL THEN nullif(array(
        SELECT e.seq FROM events e
        WHERE e.agent = s.agent AND e.channel = s.channel AND e.seq = ANY(s.restored_seqs)
          AND e.thread = s.thread AND e.seq > t.compacted_through_seq
        ORDER BY e.seq), '{}') END,
    seg_summary = CASE WHEN t.compacted_through_seq > 0 THEN t.compaction_summary END,
    boundary = 'upgrade'
FROM s
WHERE t.agent = s.agent AND t.channel = s.channel AND t.thread = s.thread
  AND t.seg_at IS NULL AND t.boundaries = 0;  -- a segment of its own: leave it
