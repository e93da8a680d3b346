-- Where a conversation's rolling window starts, one rule for every query that needs it
-- (the context read, the thread list, a restored session's visibility, saves): `at - window`
-- floored to a step of 1/24 of the window, so the edge moves once a step and the context's
-- first turns (the prompt cache's prefix) stay put in between. producers/reader.py
-- `rolling_cutoff` is the same rule in Python; a test holds them together. A plain SQL
-- function: the planner inlines it.
CREATE OR REPLACE FUNCTION contextlog_window_start(at timestamptz, window_s integer)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM at - make_interval(secs => window_s))
                              / greatest(1, window_s / 24)) * greatest(1, window_s / 24))
$$;
