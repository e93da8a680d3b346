-- Saved sessions, restore by session, compaction per thread, and the effects outbox.

-- A restore now records the restored session's message positions (any set of seqs:
-- a session may itself hold a restored session), replacing the seq range of 002,
-- which nothing had written yet.
ALTER TABLE conversations
    DROP COLUMN restore_from_seq,
    DROP COLUMN restore_until_seq,
    ADD COLUMN restored_seqs    bigint[],
    ADD COLUMN restored_session text;

-- For idle-timeout saves: what is new since the last save or clear, and which adapter
-- (the source of the last message that named one) hears about it.
ALTER TABLE conversations
    ADD COLUMN last_message_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_saved_seq   bigint NOT NULL DEFAULT 0,
    ADD COLUMN source           text;

-- window_tokens: the estimate of the thread's messages since its last clear, restore
-- or compaction (what triggers compaction; aging out of the rolling window is not
-- subtracted, the compaction job checks the real window). Messages with
-- seq <= compacted_through_seq are replaced in the context by compaction_summary.
ALTER TABLE threads
    ADD COLUMN window_tokens         bigint NOT NULL DEFAULT 0,
    ADD COLUMN compacted_through_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN compaction_summary    text;

CREATE TABLE sessions (
    agent          text        NOT NULL,
    channel        text        NOT NULL,
    session_id     text        NOT NULL,
    seq            bigint      NOT NULL,  -- the save or import event in its conversation
    created_at     timestamptz NOT NULL,
    description    text,
    preview        text        NOT NULL,
    message_count  integer     NOT NULL,
    token_estimate integer     NOT NULL,
    auto           boolean     NOT NULL DEFAULT false,
    source         text,                  -- the adapter told when the summary is ready
    provider       text,
    model          text,
    seqs           bigint[]    NOT NULL,  -- log positions of the messages, oldest first
    window_start   timestamptz,
    window_end     timestamptz,
    summary        text,                  -- NULL while the summary job is pending
    summary_local  boolean     NOT NULL DEFAULT false,
    summary_failed boolean     NOT NULL DEFAULT false,
    deleted_at     timestamptz,           -- deleting hides; the log keeps the events
    PRIMARY KEY (agent, channel, session_id)
);
CREATE INDEX sessions_newest_idx ON sessions (agent, channel, seq DESC) WHERE deleted_at IS NULL;
CREATE INDEX sessions_id_idx ON sessions (session_id);
CREATE INDEX sessions_pending_idx ON sessions (created_at) WHERE summary IS NULL;

-- Effects of a batch that leave Postgres (notifications, summary jobs), written in the
-- batch's transaction and relayed to Redis after commit, then deleted: a crash between
-- commit and relay loses none (the relay sweeps what is left).
CREATE TABLE effects (
    id         bigserial   PRIMARY KEY,
    kind       text        NOT NULL,
    body       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
