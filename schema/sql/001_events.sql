-- The append-only event log, the per-conversation sequence counter and the per-shard
-- ingest checkpoint (with the fencing epoch of the lease that wrote it).

CREATE TABLE events (
    position     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     uuid        NOT NULL,
    agent        text        NOT NULL,
    channel      text        NOT NULL,
    thread       text        NOT NULL DEFAULT '',  -- '' is the main line
    seq          bigint      NOT NULL,
    kind         text        NOT NULL,
    occurred_at  timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    payload      jsonb       NOT NULL,
    CONSTRAINT events_event_id_key UNIQUE (event_id),
    CONSTRAINT events_conversation_seq_key UNIQUE (agent, channel, seq)
);

CREATE TABLE conversations (
    agent      text   NOT NULL,
    channel    text   NOT NULL,
    last_seq   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, channel)
);

CREATE TABLE shard_checkpoints (
    shard          integer     PRIMARY KEY,
    epoch          bigint      NOT NULL,
    last_entry_id  text        NOT NULL,
    events         bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
