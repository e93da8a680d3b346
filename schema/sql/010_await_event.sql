-- A reader's `wait_for` waits inside Postgres, so its reads run the moment the event commits.
--
-- The reader used to sleep in the client on ingest's commit notification and then send its
-- reads: after the commit, the notification travelled to the reader and the reads back to
-- Postgres, a round trip on every bot turn. Now the reader sends `await_event` with the
-- reads queued behind it in one pipeline: this function returns once the event is visible
-- and the reads run at once, each with a snapshot taken after the commit.
--
-- How it wakes: a connection that has committed `LISTEN contextlog_commits` is signalled on
-- every ingest commit (`advance_checkpoint` queues the NOTIFY), and the signal sets its
-- latch, which ends `pg_sleep`'s wait even while a statement runs (it does not deliver the
-- notification: that waits until the connection is idle, and the reader has stopped
-- listening by then). Without a signal (the LISTEN not in effect, an ingest of an older
-- release) it looks again every millisecond, `pg_sleep`'s granularity.
--
-- Returns how many times it looked (1: the event was already there), or NULL when the
-- event was not stored within `timeout` seconds.
--
-- Additive and safe on a live database: a function only.
CREATE OR REPLACE FUNCTION contextlog_await_event(
    event uuid, event_agent text, event_channel text, timeout double precision)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => timeout);
    looks integer := 0;
BEGIN
    LOOP
        looks := looks + 1;
        -- Each statement of a volatile function sees what committed before it began.
        -- With the conversation: the guard's key, one partition (007).
        IF EXISTS (SELECT FROM events WHERE event_id = event
                   AND agent = event_agent AND channel = event_channel) THEN
            RETURN looks;
        END IF;
        IF clock_timestamp() >= deadline THEN
            RETURN NULL;
        END IF;
        PERFORM pg_sleep(0.00001);  -- until a commit's signal sets the latch, or 1 ms
    END LOOP;
END
$$;
