-- Named queries of attachments (loaded with queries.sql). Only these read the table, and
-- only `attachment_data` reads the bytes.

-- name: attachments_stored
SELECT sha256 FROM attachments WHERE sha256 = ANY(%(hashes)s::bytea[]);

-- name: insert_attachment
INSERT INTO attachments (sha256, size, data)
VALUES (%(sha256)s, %(size)s, %(data)b)
ON CONFLICT (sha256) DO NOTHING;

-- name: attachment_data
SELECT sha256, data FROM attachments WHERE sha256 = ANY(%(hashes)s::bytea[]);

-- name: lock_attachments
-- Before deleting attachments (an erase, retention): wait for every transaction that
-- references one of them (ingest locks what it references, KEY SHARE, 017), so that their
-- references are seen by the next statement.
SELECT sha256 FROM attachments WHERE sha256 = ANY(%(hashes)s::bytea[]) ORDER BY sha256
FOR UPDATE;

-- name: drop_unreferenced_attachments
-- Of these attachments, those no event references any more.
DELETE FROM attachments a
WHERE a.sha256 = ANY(%(hashes)s::bytea[])
  AND NOT EXISTS (SELECT FROM attachment_refs r WHERE r.sha256 = a.sha256)
RETURNING a.sha256;

-- name: refs_reindex
-- `contextlog rebuild`: every event's attachment references again, from the log as it is
-- (as migration 017 first wrote them).
INSERT INTO attachment_refs (agent, channel, seq, sha256)
SELECT e.agent, e.channel, e.seq, h
FROM events e, LATERAL contextlog_attachment_hashes(e.kind, e.payload) h
WHERE e.kind IN ('message.v1', 'imported_message.v1')
  AND jsonb_typeof(e.payload->'content') = 'array'
ON CONFLICT DO NOTHING;
