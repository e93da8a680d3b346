-- `contextlog_window_start` (006) declared STABLE, which it is, so the planner inlines it.
--
-- 006 declared it IMMUTABLE and said the planner inlines it; it did not: its body subtracts
-- an interval from a timestamptz and takes the epoch of one, both STABLE (they depend on
-- the session's time zone), and Postgres never inlines an IMMUTABLE SQL function whose
-- body is not. Every query that called it ran the SQL function executor instead, setting
-- the body up afresh for each call site on every execution: three call sites in the
-- window's definition (`contextlog_window`, 011), ~0.14 ms of a bot turn's ~0.35 ms tail
-- read. Same body, same results; no index or constraint uses the function.
--
-- Additive and safe on a live database: a function only.
CREATE OR REPLACE FUNCTION contextlog_window_start(at timestamptz, window_s integer)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM at - make_interval(secs => window_s))
                              / greatest(1, window_s / 24)) * greatest(1, window_s / 24))
$$;
