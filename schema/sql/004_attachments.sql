-- Attachments: the bytes of base64 image and document sources, stored once by their
-- sha256 whatever conversation or session posted them. Events hold references only, so
-- saves, restores and compactions (which copy log positions, never payloads) never copy
-- them, and no read but the one that puts the bytes back into a context touches this
-- table. Nothing is ever updated or deleted here: the log that references it is
-- append-only.
CREATE TABLE attachments (
    sha256     bytea       PRIMARY KEY,
    size       integer     NOT NULL,
    data       bytea       NOT NULL,
    stored_at  timestamptz NOT NULL DEFAULT now()
);
-- Images and PDFs are compressed already: kept out of line without a compression try.
ALTER TABLE attachments ALTER COLUMN data SET STORAGE EXTERNAL;
