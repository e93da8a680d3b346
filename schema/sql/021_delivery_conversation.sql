-- Webhook deliveries name their conversation (issue 34): retention drops a conversation's
-- deliveries with it, an expired session's summary leaves its deliveries, and an erase finds
-- a conversation's deliveries by index instead of parsing every stored body.
--
-- Additive: two columns filled from the body each row signed (`{"data": <the notice>}`),
-- and their index.
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS agent text;
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS channel text;
UPDATE webhook_deliveries
SET agent = convert_from(payload, 'UTF8')::jsonb->'data'->>'agent',
    channel = convert_from(payload, 'UTF8')::jsonb->'data'->>'channel'
WHERE agent IS NULL;
CREATE INDEX IF NOT EXISTS webhook_deliveries_conversation_idx
    ON webhook_deliveries (agent, channel);
