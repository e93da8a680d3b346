-- The window's definition and the budget's cut, each in one home for the two reads of a
-- thread's window: `window_messages` (a first read) and `window_tail` (a read from the
-- reader's last one, the bot turn's read), which used to be one query. Inlined by the
-- planner (SQL functions of one SELECT, not strict), so plans are those of the text.
--
-- Additive and safe on a live database: functions only.

-- The window of one thread at `at_now`: its conversation's clear, restore and last seq,
-- the compaction's edge, the rolling cut-off (006), the budget and its step, and `wkey`,
-- the window's definition as a reader's tail hint remembers it (producers/tails.py).
-- No row for a conversation without events.
CREATE OR REPLACE FUNCTION contextlog_window(
    w_agent text, w_channel text, w_thread text, at_now timestamptz,
    default_window integer, default_budget integer)
RETURNS TABLE (cleared_seq bigint, restored_seqs bigint[], restored_at timestamptz,
               cutoff timestamptz, compacted bigint, last_seq bigint, budget integer,
               step integer, wkey text)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT conv.cleared_seq, conv.restored_seqs, conv.restored_at, conv.cutoff,
           conv.compacted, conv.last_seq, conv.budget, greatest(1, conv.budget / 2),
           concat_ws(' ', extract(epoch FROM conv.cutoff)::bigint, conv.cleared_seq,
                     conv.compacted, conv.budget,
                     CASE WHEN conv.restored_at >= conv.cutoff THEN conv.restored_at END)
    FROM (
        SELECT v.cleared_seq, v.restored_seqs, v.restored_at, v.last_seq,
               coalesce(v.token_budget, default_budget) AS budget,
               coalesce((SELECT t.compacted_through_seq FROM threads t
                         WHERE t.agent = w_agent AND t.channel = w_channel
                           AND t.thread = w_thread), 0) AS compacted,
               contextlog_window_start(
                   at_now, coalesce(v.rolling_window, default_window)) AS cutoff
        FROM conversations v WHERE v.agent = w_agent AND v.channel = w_channel
    ) conv
$$;

-- Where the kept part of a window starts, in tokens of the window ahead of it: 0 (not
-- `bounded`, or the window fits), or the smallest multiple of the step that leaves at most
-- the budget. The start moves only when the window grows by a step (half a budget), so
-- one cut serves many turns and the prompt cache keeps its prefix.
CREATE OR REPLACE FUNCTION contextlog_cut(
    total bigint, budget integer, step integer, bounded boolean)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN NOT bounded OR total <= budget THEN 0
                ELSE (total - budget + step - 1) / step * step END
$$;
