-- Named SQL of `contextlog acl --postgres`: Postgres roles per contextlog role.

-- name: reader_role
-- contextlog_reader: a login role for adapters' context readers (producers.ContextReader,
-- the read models and the log), never granted contextlog_secrets (the key that signs the
-- results only workers emit), api_keys, webhooks (their signing secrets) or
-- webhook_deliveries. Give it a password (ALTER ROLE contextlog_reader PASSWORD '...'),
-- and run this again after a migration that adds a table readers read.
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'contextlog_reader') THEN
    CREATE ROLE contextlog_reader LOGIN;
  END IF;
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO contextlog_reader', current_database());
END
$$;
GRANT USAGE ON SCHEMA public TO contextlog_reader;
GRANT SELECT ON events, conversations, threads, sessions, attachments, notes
  TO contextlog_reader;
REVOKE ALL ON contextlog_secrets, api_keys, webhooks, webhook_deliveries
  FROM contextlog_reader;
