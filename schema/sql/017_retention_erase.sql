-- Retention by policy and erase (issue 34.2, 34.3).
--
-- Retention: a conversation may override its agent's policy (`retention.v1`); the
-- worker's retention step reads these with the deployment's policy (worker/store/policy.py)
-- and records each run in `retention_runs` (what `contextlog status` reports).
--
-- Erase: a session's summary has rounds (an erase that touched its messages asks for a
-- new one, and a summary of an older round no longer lands); a thread remembers which
-- restored session heads its segment and a note which session's summary it tells, so an
-- erase or an expiry can take their text out; every reference an event makes to an
-- attachment is kept in `attachment_refs`, so bytes no event references any more can be
-- deleted; `exports` lists the files `contextlog export` wrote, which `contextlog erase`
-- deletes on the host that wrote them.
--
-- Additive: columns without a rewrite, new tables, a trigger. The references of the events
-- stored so far are read from the log here, in one pass over the messages with content
-- blocks (seconds per million events; ingest waits for it, as for 009's running totals).

ALTER TABLE conversations
    ADD COLUMN IF NOT EXISTS keep_log_days integer,
    ADD COLUMN IF NOT EXISTS keep_sessions_days integer;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS summary_round integer NOT NULL DEFAULT 0;
ALTER TABLE threads ADD COLUMN IF NOT EXISTS seg_session text;
ALTER TABLE notes ADD COLUMN IF NOT EXISTS session_id text;

-- Which stored attachment (sha256) each event references.
CREATE TABLE IF NOT EXISTS attachment_refs (
    agent   text   NOT NULL,
    channel text   NOT NULL,
    seq     bigint NOT NULL,
    sha256  bytea  NOT NULL,
    PRIMARY KEY (agent, channel, seq, sha256)
);
CREATE INDEX IF NOT EXISTS attachment_refs_sha256_idx ON attachment_refs (sha256);

-- The attachments a stored payload references (its content blocks, tool results and
-- documents at any depth): the same walk as schema/attachments.py `refs`.
CREATE OR REPLACE FUNCTION contextlog_attachment_hashes(kind text, payload jsonb)
RETURNS SETOF bytea LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT DISTINCT decode(v #>> '{}', 'hex')
    FROM jsonb_path_query(payload->'content',
                          'strict $.** ? (@.type == "contextlog.attachment").sha256') v
    WHERE kind IN ('message.v1', 'imported_message.v1')
      AND jsonb_typeof(payload->'content') = 'array'
      AND jsonb_typeof(v) = 'string' AND v #>> '{}' ~ '^[0-9a-f]{64}$'
$$;

-- The references of the events one statement inserted. Each referenced attachment is
-- locked (KEY SHARE) for the transaction: one being deleted (an erase, retention) waits
-- for it, or has gone already, and then the batch fails with CL002, which ingest takes as
-- a passing failure: it reads the entries again, and brings the bytes from Redis anew.
CREATE OR REPLACE FUNCTION contextlog_refs_logged()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted bytea[];
    present integer;
BEGIN
    WITH r AS (
        INSERT INTO attachment_refs (agent, channel, seq, sha256)
        SELECT n.agent, n.channel, n.seq, h
        FROM logged n, LATERAL contextlog_attachment_hashes(n.kind, n.payload) h
        WHERE jsonb_typeof(n.payload->'content') = 'array'
        ON CONFLICT DO NOTHING
        RETURNING sha256
    )
    SELECT array_agg(DISTINCT sha256) INTO wanted FROM r;
    IF wanted IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO present FROM (
        SELECT 1 FROM attachments a WHERE a.sha256 = ANY(wanted) FOR KEY SHARE
    ) locked;
    IF present < cardinality(wanted) THEN
        RAISE EXCEPTION 'an attachment a new event references is not stored (deleted meanwhile)'
            USING ERRCODE = 'CL002',
                  HINT = 'ingest reads the entries again and brings the bytes from Redis';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS contextlog_refs ON events;
CREATE TRIGGER contextlog_refs AFTER INSERT ON events
    REFERENCING NEW TABLE AS logged
    FOR EACH STATEMENT EXECUTE FUNCTION contextlog_refs_logged();

INSERT INTO attachment_refs (agent, channel, seq, sha256)
SELECT e.agent, e.channel, e.seq, h
FROM events e, LATERAL contextlog_attachment_hashes(e.kind, e.payload) h
WHERE e.kind IN ('message.v1', 'imported_message.v1')
  AND jsonb_typeof(e.payload->'content') = 'array'
ON CONFLICT DO NOTHING;

-- The files `contextlog export` wrote: where (host, absolute path), what (the session),
-- and their sha256, so an erase deletes only the file it wrote, unchanged.
CREATE TABLE IF NOT EXISTS exports (
    host       text        NOT NULL,
    path       text        NOT NULL,
    agent      text        NOT NULL,
    channel    text        NOT NULL,
    session_id text        NOT NULL,
    sha256     bytea       NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now(),
    -- Set by an erase that reached the session (its names blanked): the file waits for
    -- `contextlog erase` on its host to delete it.
    erased_at  timestamptz,
    PRIMARY KEY (host, path)
);
CREATE INDEX IF NOT EXISTS exports_session_idx ON exports (agent, channel, session_id);

-- One row per run of the retention step: what it did and what is left.
CREATE TABLE IF NOT EXISTS retention_runs (
    id            bigserial   PRIMARY KEY,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    conversations integer     NOT NULL DEFAULT 0,  -- dropped (log retention)
    events        bigint      NOT NULL DEFAULT 0,
    expiring      integer     NOT NULL DEFAULT 0,  -- conversations told to expire sessions
    pinned        integer     NOT NULL DEFAULT 0,  -- due, but a kept session holds them
    left_due      integer     NOT NULL DEFAULT 0,  -- due, beyond this run's bound
    error         text
);

-- How long a conversation's log (`what` = 'log') or sessions ('sessions') are kept, in
-- seconds (NULL: for ever): its own override (`retention.v1`, days), else its agent's
-- rule, else the deployment's (`policies`: [{"agent": name or null, "log": s, "sessions":
-- s}], -1 for ever; worker/store/policy.py builds it from the settings).
CREATE OR REPLACE FUNCTION contextlog_keep(
    p_agent text, own_days integer, policies jsonb, what text)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT nullif(coalesce(
        own_days * 86400,
        (SELECT (p->>what)::integer FROM jsonb_array_elements(policies) p
         WHERE p->>'agent' = p_agent),
        (SELECT (p->>what)::integer FROM jsonb_array_elements(policies) p
         WHERE jsonb_typeof(p->'agent') = 'null')), -1)
$$;

-- schema/erasure.py `filler`: a text as long as `t` saying it was erased (a test holds the
-- two to one another).
CREATE OR REPLACE FUNCTION contextlog_filler(t text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN t IS NULL OR t = '' THEN t
                ELSE left(repeat('[erased] ', length(t) / 9 + 1), length(t)) END
$$;
