-- Named queries of attachments (loaded with queries.sql). Only these read the table.

-- name: attachments_stored
SELECT sha256 FROM attachments WHERE sha256 = ANY(%(hashes)s::bytea[]);

-- name: insert_attachment
INSERT INTO attachments (sha256, size, data)
VALUES (%(sha256)s, %(size)s, %(data)b)
ON CONFLICT (sha256) DO NOTHING;

-- name: attachment_data
SELECT sha256, data FROM attachments WHERE sha256 = ANY(%(hashes)s::bytea[]);
