-- The window index also carries each message's seq and token count, so the context read
-- sums a long window's tokens by an index-only scan and reads payloads only for the rows
-- the budget keeps (issue 12.2). Numbered 005: 004 is taken by attachments; the runner
-- applies whatever is missing, in order. Rebuilding the index locks writes to `events`
-- for its duration (seconds per million messages).
DROP INDEX events_window_idx;
CREATE INDEX events_window_idx ON events (agent, channel, thread, occurred_at)
    INCLUDE (seq, tokens) WHERE kind = 'message.v1';
