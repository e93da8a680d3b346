-- Rolling-window read model: token estimates on messages, the window index, and the
-- per-conversation projection (last clear, settings, activity) plus per-thread activity.

ALTER TABLE events ADD COLUMN tokens integer NOT NULL DEFAULT 0;

-- The window read: one conversation's thread, messages since a cut-off time.
CREATE INDEX events_window_idx ON events (agent, channel, thread, occurred_at)
    WHERE kind = 'message.v1';

ALTER TABLE conversations
    ADD COLUMN cleared_seq      bigint NOT NULL DEFAULT 0,
    ADD COLUMN cleared_at       timestamptz,
    ADD COLUMN rolling_window   integer,
    ADD COLUMN idle_timeout     integer,
    ADD COLUMN token_budget     integer,
    ADD COLUMN last_activity_at timestamptz,
    -- A restored session: its messages are seq (restore_from_seq, restore_until_seq] of
    -- this conversation and count as recent from restored_at (set by the restore command
    -- of the sessions read model; a restore also moves cleared_seq, like a clear).
    ADD COLUMN restore_from_seq  bigint,
    ADD COLUMN restore_until_seq bigint,
    ADD COLUMN restored_at       timestamptz;

CREATE TABLE threads (
    agent            text        NOT NULL,
    channel          text        NOT NULL,
    thread           text        NOT NULL,
    message_count    bigint      NOT NULL DEFAULT 0,
    last_activity_at timestamptz NOT NULL,
    PRIMARY KEY (agent, channel, thread)
) WITH (fillfactor = 50);

-- Both projections are updated in place by every batch: room on each page lets those
-- be HOT updates, which touch no index.
ALTER TABLE conversations SET (fillfactor = 50);
