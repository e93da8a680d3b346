-- Named queries of erase (worker/store/erase.py; the contract: schema/erasure.py) and of
-- the summaries an erase or a boundary made moot.

-- name: blank_summary
-- A summary that no longer applies (a session summary of an earlier round, a compaction a
-- boundary overtook) may draw on messages erased since it was written: its text in the
-- log becomes filler of the same length (`contextlog_filler`, 017), as an erase leaves it.
UPDATE events SET payload = payload
    || CASE WHEN jsonb_typeof(payload->'summary') = 'string'
            THEN jsonb_build_object('summary', contextlog_filler(payload->>'summary'))
            ELSE '{}'::jsonb END
    || CASE WHEN jsonb_typeof(payload->'block') = 'object'
            THEN jsonb_build_object('block', jsonb_build_object(
                     'type', 'compaction',
                     'content', contextlog_filler(payload->'block'->>'content')))
            ELSE '{}'::jsonb END
WHERE agent = %(agent)s AND channel = %(channel)s AND seq = %(seq)s;

-- name: forget_session_text
-- The text of sessions %(sessions)s (expired, or drawing on erased messages) leaves the
-- conversation's threads: a segment whose header resumed one gets a note without its
-- summary, a note that told one's summary says it was removed. Each such thread crosses a
-- boundary (%(kind)s): what precedes its kept turns changed, so their thinking is removed.
WITH c AS (
    SELECT last_seq FROM conversations WHERE agent = %(agent)s AND channel = %(channel)s
), n AS (
    UPDATE notes SET text = format('The summary of the resumed session %%s was removed (%%s).',
                                   session_id, %(why)s::text)
    WHERE agent = %(agent)s AND channel = %(channel)s AND session_id = ANY(%(sessions)s)
    RETURNING thread
)
UPDATE threads h SET
    seg_note = CASE WHEN h.seg_session = ANY(%(sessions)s)
                    THEN format('Resumed saved session %%s; its summary was removed (%%s).',
                                h.seg_session, %(why)s::text)
                    ELSE h.seg_note END,
    note_session = CASE WHEN h.seg_session = ANY(%(sessions)s) THEN NULL
                        ELSE h.note_session END,
    boundaries = h.boundaries + 1, boundary = %(kind)s, boundary_seq = c.last_seq,
    strip_through = greatest(h.strip_through, c.last_seq)
FROM c
WHERE h.agent = %(agent)s AND h.channel = %(channel)s
  AND (h.seg_session = ANY(%(sessions)s) OR h.thread IN (SELECT thread FROM n));

-- name: recount_headers
-- The threads of a conversation that just crossed an erase or expiry boundary (the
-- conversation's last seq): their header's tokens and their segment's again, as
-- `contextlog_segment_steps` (014) counts them.
UPDATE threads h SET
    seg_extra = contextlog_header_tokens(seg_note, seg_summary, seg_threads)
                + coalesce(length(seg_block->>'content') / 4, 0),
    window_tokens = tokens_through - seg_base
                    + contextlog_header_tokens(seg_note, seg_summary, seg_threads)
                    + coalesce(length(seg_block->>'content') / 4, 0)
FROM conversations c
WHERE h.agent = %(agent)s AND h.channel = %(channel)s
  AND c.agent = h.agent AND c.channel = h.channel
  AND h.boundary IN ('erase', 'expire') AND h.boundary_seq = c.last_seq;
