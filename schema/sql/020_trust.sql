-- Trust no writer and no clock (issue 30).
--
-- The key that signs the results only workers emit (schema/signing.py), when the
-- deployment sets no CONTEXTLOG_SIGNING_KEY: made by the first ingest or worker that needs
-- it, read by the others. Not granted to PUBLIC: a role that may read contexts (an
-- adapter's) is not given it, so it cannot sign a summary or a compaction.
--
-- Additive: a table and a column.
CREATE TABLE IF NOT EXISTS contextlog_secrets (
    name       text        PRIMARY KEY,
    value      bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON contextlog_secrets FROM PUBLIC;

-- An imported session is listed by when it was imported (its `created_at`, the time
-- ingest logged the import, as every session's), and keeps the time it was saved where
-- it was exported from here.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS imported_from timestamptz;
