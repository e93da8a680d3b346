-- Named queries, loaded once by schema.queries. Each starts with a `-- name: NAME` line.

-- name: existing_event_ids
SELECT event_id FROM events WHERE event_id = ANY(%(ids)s::uuid[]);

-- name: advance_checkpoint
-- Fencing: a writer whose lease epoch is older than the last committed one is refused
-- (no row returned), so a stalled former owner can never commit after its successor.
INSERT INTO shard_checkpoints AS s (shard, epoch, last_entry_id, events, updated_at)
VALUES (%(shard)s, %(epoch)s, %(last_entry_id)s, %(events)s, now())
ON CONFLICT (shard) DO UPDATE
    SET epoch = EXCLUDED.epoch,
        last_entry_id = EXCLUDED.last_entry_id,
        events = s.events + EXCLUDED.events,
        updated_at = now()
    WHERE s.epoch <= EXCLUDED.epoch
RETURNING shard;

-- name: advance_conversations
-- Reserves `count` sequence numbers per conversation and returns the new last one.
-- The upsert's row lock is what serialises two writers of one conversation.
INSERT INTO conversations AS c (agent, channel, last_seq)
SELECT * FROM unnest(%(agents)s::text[], %(channels)s::text[], %(counts)s::bigint[])
ON CONFLICT (agent, channel) DO UPDATE SET last_seq = c.last_seq + EXCLUDED.last_seq
RETURNING agent, channel, last_seq;

-- name: copy_events
COPY events (event_id, agent, channel, thread, seq, kind, occurred_at, payload) FROM STDIN;

-- name: checkpoints
SELECT shard, epoch, last_entry_id, events, updated_at FROM shard_checkpoints ORDER BY shard;

-- name: events_stored
SELECT coalesce(sum(events), 0)::bigint AS stored FROM shard_checkpoints;

-- name: conversation_events
SELECT position, event_id, thread, seq, kind, occurred_at, recorded_at, payload
FROM events WHERE agent = %(agent)s AND channel = %(channel)s
ORDER BY seq LIMIT %(limit)s;

-- name: recent_events
SELECT position, event_id, agent, channel, thread, seq, kind, occurred_at, payload
FROM events ORDER BY position DESC LIMIT %(limit)s;
