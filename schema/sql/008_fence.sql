-- The ingest fence as a statement error, so a bot turn's batch commits in one round trip.
--
-- A writer whose lease epoch is older than the shard's last committed one must commit
-- nothing. Ingest used to read `advance_checkpoint`'s answer (no row: fenced) before it
-- sent COMMIT, which cost a round trip of its own. `advance_checkpoint` now passes its
-- outcome to this function, which raises when the upsert was refused: the statement
-- fails, Postgres skips the rest of the pipeline (COMMIT included) and the transaction
-- is rolled back, so ingest can send COMMIT with everything else and read the answers
-- afterwards. SQLSTATE CL001 (class CL is unused by Postgres) is ingest's `Fenced`.
--
-- Additive and safe on a live database: a function only (no table is locked), and a
-- writer of the release before, which does not call it, is unaffected.
CREATE OR REPLACE FUNCTION contextlog_fence(shard integer, epoch bigint, advanced boolean)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    IF NOT advanced THEN
        RAISE EXCEPTION 'shard %: epoch % is older than the last writer''s', shard, epoch
            USING ERRCODE = 'CL001',
                  HINT = 'a newer ingest owns this shard; this one must stop writing it';
    END IF;
    RETURN shard;
END
$$;
