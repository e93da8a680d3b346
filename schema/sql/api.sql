-- Named queries of the HTTP API (worker/api) and its webhooks (worker/effects/webhooks.py).

-- name: insert_api_key
INSERT INTO api_keys (key_id, secret_hash, name, agents, channels, rights)
VALUES (%(key_id)s, %(secret_hash)s, %(name)s, %(agents)s, %(channels)s, %(rights)s);

-- name: get_api_key
SELECT key_id, secret_hash, name, agents, channels, rights, created_at, revoked_at
FROM api_keys WHERE key_id = %(key_id)s;

-- name: list_api_keys
SELECT key_id, secret_hash, name, agents, channels, rights, created_at, revoked_at
FROM api_keys ORDER BY created_at, key_id;

-- name: revoke_api_key
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE key_id = %(key_id)s RETURNING key_id;

-- name: insert_webhook
INSERT INTO webhooks (webhook_id, url, source, kinds, agents, channels, secret, created_by)
VALUES (%(webhook_id)s, %(url)s, %(source)s, %(kinds)s, %(agents)s, %(channels)s,
        %(secret)s, %(created_by)s)
RETURNING webhook_id, url, source, kinds, agents, channels, secret, created_by, created_at;

-- name: list_webhooks
SELECT webhook_id, url, source, kinds, agents, channels, secret, created_by, created_at
FROM webhooks WHERE deleted_at IS NULL ORDER BY created_at, webhook_id;

-- name: delete_webhook
UPDATE webhooks SET deleted_at = now()
WHERE webhook_id = %(webhook_id)s AND deleted_at IS NULL RETURNING webhook_id;

-- name: insert_delivery
-- A notice reaches a webhook once: a redelivered notice finds its row and adds none.
INSERT INTO webhook_deliveries (delivery_id, webhook_id, notice_id, kind, payload, agent,
                                channel)
VALUES (%(delivery_id)s, %(webhook_id)s, %(notice_id)s, %(kind)s, %(payload)s, %(agent)s,
        %(channel)s)
ON CONFLICT (webhook_id, notice_id) DO NOTHING
RETURNING delivery_id;

-- name: get_delivery
SELECT d.delivery_id, d.webhook_id, d.notice_id, d.kind, d.payload, d.status, d.attempts,
       d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at,
       w.url, w.secret, w.deleted_at IS NOT NULL AS deleted
FROM webhook_deliveries d JOIN webhooks w USING (webhook_id)
WHERE d.delivery_id = %(delivery_id)s;

-- name: list_deliveries
SELECT d.delivery_id, d.webhook_id, d.notice_id, d.kind, d.status, d.attempts,
       d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at
FROM webhook_deliveries d
WHERE (%(webhook_id)s::text IS NULL OR d.webhook_id = %(webhook_id)s)
  AND (%(status)s::text IS NULL OR d.status = %(status)s)
ORDER BY d.created_at DESC, d.delivery_id DESC LIMIT %(limit)s;

-- name: record_attempt
UPDATE webhook_deliveries
SET status = %(status)s, attempts = attempts + 1, last_status = %(last_status)s,
    last_error = %(last_error)s, updated_at = now(),
    delivered_at = CASE WHEN %(status)s = 'delivered' THEN now() END,
    next_attempt_at = coalesce(%(next_at)s::timestamptz, now())
WHERE delivery_id = %(delivery_id)s;

-- name: replay_delivery
UPDATE webhook_deliveries
SET status = 'pending', attempts = 0, updated_at = now(), next_attempt_at = now()
WHERE delivery_id = %(delivery_id)s
  AND (%(webhook_id)s::text IS NULL OR webhook_id = %(webhook_id)s)
RETURNING delivery_id;

-- name: stalled_deliveries
-- Pending deliveries nothing touched for a while: their job was lost (a crash between the
-- row and the job, Redis data loss). Queued again by the dispatcher.
SELECT delivery_id FROM webhook_deliveries
WHERE status = 'pending' AND next_attempt_at < now() - make_interval(secs => %(grace)s)
ORDER BY next_attempt_at LIMIT %(limit)s;
