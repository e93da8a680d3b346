-- A thread's running token total on each message, so a first read finds its cut from
-- the rows it keeps, not by summing the whole window (issue 12.2).
--
-- `events.through`: the tokens of the thread's messages up to and including this one
-- (all time; commands: NULL). A window that is one contiguous run of its thread's
-- messages sums to through(last) - through(first) + tokens(first), and where the kept part
-- starts is the first row whose through - tokens reaches the cut: two lookups and a walk
-- back over the kept rows, whatever the window's length.
--
-- `events.late`: the message may not be where its time says it is in the thread: its
-- occurred_at is earlier than a message before it (producers' clocks disagree; imports),
-- or its writer did not say (a writer of the release before, during an upgrade: the
-- column's default, true, where that writer leaves it out; its rows carry no `through`
-- either). A window is a contiguous run unless such a row lies in it, below its edge; a
-- read finds them by the partial index, which holds these rows only, and sums the window
-- as before when there is one. Rows stored before this migration are NULL on both: a
-- window that starts on one is summed as before, so no row is rewritten here.
--
-- `threads.tokens_through`: the thread's total so far, which the next message adds to;
-- set here from the log (one pass over `events`, in the migration's transaction).
--
-- Additive: columns with no rewrite (a NULL column; a constant default), an index built
-- over the log while writers wait, one UPDATE of `threads`. IF NOT EXISTS: tests give an
-- older layout the columns today's writer writes (tests/support/services.py).

ALTER TABLE events ADD COLUMN IF NOT EXISTS through bigint;
ALTER TABLE events ADD COLUMN IF NOT EXISTS late boolean;
ALTER TABLE events ALTER COLUMN late SET DEFAULT true;

ALTER TABLE threads ADD COLUMN IF NOT EXISTS tokens_through bigint NOT NULL DEFAULT 0;
UPDATE threads t SET tokens_through = s.tokens
FROM (SELECT agent, channel, thread, sum(tokens) AS tokens FROM events
      WHERE kind = 'message.v1' GROUP BY agent, channel, thread) s
WHERE t.agent = s.agent AND t.channel = s.channel AND t.thread = s.thread;

CREATE INDEX events_late_idx ON events (agent, channel, thread, seq)
    INCLUDE (occurred_at, through) WHERE late;
