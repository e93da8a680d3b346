-- The HTTP API (`contextlog api`): its keys, the webhooks registered through it, and each
-- webhook's deliveries. None of these are events: they are the API's own configuration and
-- delivery bookkeeping, not conversation data, so they are neither in the log nor rebuilt.

-- A key is shown once, at creation: only the SHA-256 of its secret part is kept. Keys are
-- 256 random bits, so a fast hash is enough (a slow one protects guessable passwords).
CREATE TABLE api_keys (
    key_id      text        PRIMARY KEY,
    secret_hash bytea       NOT NULL,
    name        text        NOT NULL DEFAULT '',
    agents      text[]      NOT NULL,            -- '*' alone: every agent
    channels    text[],                          -- NULL: every channel of those agents
    rights      text[]      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE webhooks (
    webhook_id  text        PRIMARY KEY,
    url         text        NOT NULL,
    source      text        NOT NULL,            -- the notification stream it follows
    kinds       text[]      NOT NULL,
    agents      text[]      NOT NULL,            -- of the key that registered it
    channels    text[],
    secret      text        NOT NULL,            -- whsec_...: needed in clear to sign
    created_by  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);

CREATE INDEX webhooks_source_idx ON webhooks (source) WHERE deleted_at IS NULL;

-- One row per (webhook, notice): the `webhook-id` a receiver dedupes on, the same on
-- every attempt and replay.
CREATE TABLE webhook_deliveries (
    delivery_id  text        PRIMARY KEY,
    webhook_id   text        NOT NULL REFERENCES webhooks (webhook_id),
    notice_id    text        NOT NULL,
    kind         text        NOT NULL,
    payload      bytea       NOT NULL,           -- the body, byte for byte as signed
    status       text        NOT NULL DEFAULT 'pending',   -- pending, delivered, failed
    attempts     integer     NOT NULL DEFAULT 0,
    last_status  integer,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),  -- when its job is due
    UNIQUE (webhook_id, notice_id)
);

CREATE INDEX webhook_deliveries_status_idx ON webhook_deliveries (status, next_attempt_at);
