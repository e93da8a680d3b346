-- `events` partitioned by a hash of the conversation (issue 14.3), converted in place.
--
-- Why hash by (agent, channel) and not by time: every read names its conversation, so a
-- read (window by time, a restored session's seqs, a session's messages) and every
-- append's unique checks touch one partition's indexes, whatever the log's age; with
-- time partitions a lookup by seq or event id visits every partition, and uniqueness of
-- event_id would need a second, unpartitioned table as its guard. Old data leaves by
-- whole conversations (`contextlog retire`), not by dropping a time range.
--
-- Postgres wants the partition key in every unique constraint: the event id guard is now
-- (event_id, agent, channel) (event_id first: ids are time-ordered uuid7s, so inserts
-- stay at the index's right edge, as they did). A redelivery carries its conversation,
-- so it is still absorbed; the same id in two conversations is two events (a platform
-- message id derived into an event id is only unique per chat on some platforms).
-- The partitions' constraints are named `events_pNN_event_id_key`: a unique violation
-- names the partition's constraint, and ingest recognises the guard by that name.
--
-- The conversion runs in the migration's transaction (all or nothing): the old table
-- is renamed, its rows copied with their positions, indexes built after the copy,
-- the identity continued after the highest position, the old table dropped. Writers
-- wait for it (seconds per million events: README, "Partitioned log").

ALTER TABLE events RENAME TO events_006;
ALTER TABLE events_006 RENAME CONSTRAINT events_pkey TO events_006_pkey;
ALTER TABLE events_006 RENAME CONSTRAINT events_event_id_key TO events_006_event_id_key;
ALTER TABLE events_006 RENAME CONSTRAINT events_conversation_seq_key
    TO events_006_conversation_seq_key;
ALTER INDEX events_window_idx RENAME TO events_006_window_idx;
ALTER SEQUENCE events_position_seq RENAME TO events_006_position_seq;

CREATE TABLE events (
    position     bigint      GENERATED ALWAYS AS IDENTITY,
    event_id     uuid        NOT NULL,
    agent        text        NOT NULL,
    channel      text        NOT NULL,
    thread       text        NOT NULL DEFAULT '',
    seq          bigint      NOT NULL,
    kind         text        NOT NULL,
    occurred_at  timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    payload      jsonb       NOT NULL,
    tokens       integer     NOT NULL DEFAULT 0
) PARTITION BY HASH (agent, channel);

DO $$
BEGIN
    FOR i IN 0..15 LOOP
        EXECUTE format('CREATE TABLE events_p%s PARTITION OF events'
                       ' FOR VALUES WITH (MODULUS 16, REMAINDER %s)', lpad(i::text, 2, '0'), i);
    END LOOP;
END $$;

INSERT INTO events (position, event_id, agent, channel, thread, seq, kind, occurred_at,
                    recorded_at, payload, tokens)
OVERRIDING SYSTEM VALUE
SELECT position, event_id, agent, channel, thread, seq, kind, occurred_at, recorded_at,
       payload, tokens
FROM events_006;

-- Positions go on from where the old table's identity stood (never reused).
SELECT setval(pg_get_serial_sequence('events', 'position'), greatest(s.last_value, m.top))
FROM events_006_position_seq s, (SELECT coalesce(max(position), 1) AS top FROM events_006) m
WHERE s.is_called OR m.top > 1;

-- Each partition's guards under a name ingest recognises, then the parent's, which
-- adopts them; indexes after the copy (one sort each, not row by row).
DO $$
BEGIN
    FOR i IN 0..15 LOOP
        EXECUTE format('ALTER TABLE events_p%1$s ADD CONSTRAINT events_p%1$s_event_id_key'
                       ' UNIQUE (event_id, agent, channel)', lpad(i::text, 2, '0'));
        EXECUTE format('ALTER TABLE events_p%1$s ADD CONSTRAINT events_p%1$s_conversation_seq_key'
                       ' UNIQUE (agent, channel, seq)', lpad(i::text, 2, '0'));
    END LOOP;
END $$;
ALTER TABLE events ADD CONSTRAINT events_event_id_key UNIQUE (event_id, agent, channel);
ALTER TABLE events ADD CONSTRAINT events_conversation_seq_key UNIQUE (agent, channel, seq);
-- Log order, for replay and export (each partition's index, merged).
CREATE INDEX events_position_idx ON events (position);
CREATE INDEX events_window_idx ON events (agent, channel, thread, occurred_at)
    INCLUDE (seq, tokens) WHERE kind = 'message.v1';

DROP TABLE events_006;
