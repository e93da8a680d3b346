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

-- name: erase_position
-- Where an erase event sits in the log: it erases what was logged before it.
SELECT position FROM events WHERE agent = %(agent)s AND channel = %(channel)s AND seq = %(seq)s;

-- name: erase_conversations
-- The agent's conversations (an erase keeps those of its shard: worker/store/erase.py).
SELECT channel FROM conversations
WHERE agent = %(agent)s AND NOT starts_with(channel, 'contextlog:erase:')
ORDER BY channel;

-- name: erase_sender_events
-- A sender's events logged before the erase (position %(before)s) in these conversations:
-- what they sent (any event naming them, hashed as schema/erasure.py `subject_hash`), and
-- the messages of the exchanges they opened (the assistant's answers, tool calls and
-- results, system messages, up to the next opening user message of the thread).
WITH m AS MATERIALIZED (
    SELECT e.channel, e.thread, e.seq, e.kind,
           encode(sha256(convert_to(%(agent)s, 'UTF8') || '\x00'::bytea
                         || convert_to('sender', 'UTF8') || '\x00'::bytea
                         || convert_to(e.payload->>'sender', 'UTF8')), 'hex') AS who,
           e.kind = 'message.v1'
           AND coalesce(e.mark, contextlog_mark_of(e.kind, e.payload), 0) = 1 AS opens
    FROM events e
    WHERE e.agent = %(agent)s AND e.channel = ANY(%(channels)s::text[])
      AND e.position < %(before)s
), o AS MATERIALIZED (
    SELECT m.*, max(m.seq) FILTER (WHERE m.opens)
                    OVER (PARTITION BY m.channel, m.thread ORDER BY m.seq) AS opener
    FROM m
)
-- (Payloads are read for the matches only: the scan keeps names and hashes.)
SELECT o.channel, o.seq, e.event_id, e.payload
FROM o LEFT JOIN o x ON x.channel = o.channel AND x.seq = o.opener
JOIN events e ON e.agent = %(agent)s AND e.channel = o.channel AND e.seq = o.seq
WHERE o.who = %(subject)s
   OR (o.kind = 'message.v1' AND NOT o.opens AND x.who = %(subject)s)
ORDER BY o.channel, o.seq;

-- name: erase_session_events
-- A session's events logged before the erase: its messages, the save or import that made
-- it, and its summaries.
SELECT e.channel, e.seq, e.event_id, e.payload
FROM sessions s JOIN events e ON e.agent = s.agent AND e.channel = s.channel
WHERE s.agent = %(agent)s AND s.channel = %(channel)s AND s.session_id = %(session_id)s
  AND (e.seq = ANY(s.seqs) OR e.seq = s.seq
       OR (e.kind = 'summary.v1' AND e.payload->>'session_id' = s.session_id))
  AND e.position < %(before)s
ORDER BY e.seq;

-- name: conversation_sessions
SELECT session_id FROM sessions WHERE agent = %(agent)s AND channel = %(channel)s
ORDER BY seq;

-- name: conversation_event_ids
SELECT event_id FROM events WHERE agent = %(agent)s AND channel = %(channel)s
  AND position < %(before)s;

-- name: redact_events
-- Erased payloads (schema/erasure.py `redact_payload`) in place; nothing else of the rows
-- changes (seq, time, kind, token estimate, mark: every position and count stays).
UPDATE events e SET payload = u.payload
FROM unnest(%(channels)s::text[], %(seqs)s::bigint[], %(payloads)s::jsonb[])
     AS u(channel, seq, payload)
WHERE e.agent = %(agent)s AND e.channel = u.channel AND e.seq = u.seq;

-- name: erased_by
-- The events of a conversation an erase redacted (their `erased` mark): the same rows in
-- live ingest and in a replay, where they were redacted long before.
SELECT seq, thread, kind, event_id FROM events
WHERE agent = %(agent)s AND channel = %(channel)s AND position < %(before)s
  AND payload->'erased'->>'erase_id' = %(erase_id)s
ORDER BY seq;

-- name: erase_search_rows
DELETE FROM search_messages
WHERE agent = %(agent)s AND channel = %(channel)s AND seq = ANY(%(seqs)s::bigint[]);

-- name: erase_refs
-- Their attachment references go; the hashes are returned (bytes no other event
-- references are deleted next).
DELETE FROM attachment_refs
WHERE agent = %(agent)s AND channel = %(channel)s AND seq = ANY(%(seqs)s::bigint[])
RETURNING sha256;

-- name: tainted_sessions
-- Sessions holding an erased message or made by an erased command (deleted ones too), with
-- their first message.
SELECT s.session_id, s.seq, s.summary_round, f.payload->'content' AS first
FROM sessions s
LEFT JOIN events f ON f.agent = s.agent AND f.channel = s.channel AND f.seq = s.seqs[1]
WHERE s.agent = %(agent)s AND s.channel = %(channel)s
  AND (s.seqs && %(seqs)s::bigint[] OR s.seq = ANY(%(seqs)s::bigint[])
       OR s.session_id = %(session_id)s)
ORDER BY s.seq;

-- name: keep_session_id
-- The event that made a session keeps the session's id (`erased.session_id`): a replay of
-- the redacted log, where what the id came from is gone, gives the session that id again.
UPDATE events SET payload = jsonb_set(
    payload, '{erased}',
    jsonb_build_object('erase_id', coalesce(payload->'erased'->>'erase_id', %(erase_id)s::text),
                       'session_id', %(session_id)s::text))
WHERE agent = %(agent)s AND channel = %(channel)s AND seq = %(seq)s
  AND kind IN ('save.v1', 'session_imported.v1');

-- name: retake_session
-- A session whose messages or making command were erased: its description and preview as
-- what is left says them, and its summary asked for again (a new round; the one before no
-- longer lands).
UPDATE sessions s SET description = src.payload->>'description', preview = %(preview)s,
    summary = NULL, summary_local = false, summary_failed = false,
    summary_round = s.summary_round + 1
FROM events src
WHERE s.agent = %(agent)s AND s.channel = %(channel)s AND s.session_id = %(session_id)s
  AND src.agent = s.agent AND src.channel = s.channel AND src.seq = s.seq
RETURNING s.summary_round, s.deleted_at IS NULL AS live;

-- name: drop_session
DELETE FROM sessions
WHERE agent = %(agent)s AND channel = %(channel)s AND session_id = %(session_id)s;

-- name: blank_session_summaries
-- The summaries of these sessions in the log (summary.v1, an import's) drew on what was
-- erased: filler of the same length.
UPDATE events SET payload = payload
    || jsonb_build_object('summary', contextlog_filler(payload->>'summary'))
WHERE agent = %(agent)s AND channel = %(channel)s AND position < %(before)s
  AND kind IN ('summary.v1', 'session_imported.v1')
  AND payload->>'session_id' = ANY(%(sessions)s::text[])
  AND jsonb_typeof(payload->'summary') = 'string'
RETURNING event_id;

-- name: blank_compactions
-- Our compactions that summarised an erased message of their thread (through_seq at or
-- after it): filler of the same length in the log, so a replay decides as this log did.
UPDATE events e SET payload = e.payload
    || jsonb_build_object('summary', contextlog_filler(e.payload->>'summary'))
    || CASE WHEN jsonb_typeof(e.payload->'block') = 'object'
            THEN jsonb_build_object('block', jsonb_build_object(
                     'type', 'compaction',
                     'content', contextlog_filler(e.payload->'block'->>'content')))
            ELSE '{}'::jsonb END
WHERE e.agent = %(agent)s AND e.channel = %(channel)s AND e.position < %(before)s
  AND e.kind = 'compaction.v1'
  AND EXISTS (SELECT FROM unnest(%(threads)s::text[], %(seqs)s::bigint[]) AS r(thread, seq)
              WHERE r.thread = e.thread AND r.seq <= (e.payload->>'through_seq')::bigint)
RETURNING e.event_id;

-- name: compaction_answers
-- Assistant messages holding the API's compaction block (mark 2) after an erased message
-- of their thread: their summary tells it.
SELECT e.seq, e.payload, e.event_id FROM events e
WHERE e.agent = %(agent)s AND e.channel = %(channel)s AND e.position < %(before)s
  AND e.kind = 'message.v1' AND e.mark = 2
  AND EXISTS (SELECT FROM unnest(%(threads)s::text[], %(seqs)s::bigint[]) AS r(thread, seq)
              WHERE r.thread = e.thread AND r.seq < e.seq);

-- name: erase_threads
-- Every thread of a conversation an erase touched crosses a boundary ('erase'): what it
-- showed may have changed anywhere. A summary (ours, or the API's block) that covered an
-- erased message of the thread (before the segment's start; a pending one through its
-- `pending_through`) is replaced by %(summary_erased)s, or dropped while pending.
WITH r AS (
    SELECT * FROM unnest(%(threads)s::text[], %(seqs)s::bigint[]) AS r(thread, seq)
)
UPDATE threads h SET
    seg_summary = CASE WHEN h.seg_summary IS NOT NULL AND EXISTS (
                           SELECT FROM r WHERE r.thread = h.thread AND r.seq < h.seg_start)
                       THEN %(summary_erased)s ELSE h.seg_summary END,
    seg_block = CASE WHEN h.seg_block IS NOT NULL AND EXISTS (
                         SELECT FROM r WHERE r.thread = h.thread AND r.seq < h.seg_start)
                     THEN jsonb_build_object('type', 'compaction',
                                             'content', %(summary_erased)s::text)
                     ELSE h.seg_block END,
    pending_summary = CASE WHEN EXISTS (SELECT FROM r WHERE r.thread = h.thread
                                          AND r.seq <= h.pending_through)
                           THEN NULL ELSE h.pending_summary END,
    pending_through = CASE WHEN EXISTS (SELECT FROM r WHERE r.thread = h.thread
                                          AND r.seq <= h.pending_through)
                           THEN NULL ELSE h.pending_through END,
    compaction_summary = NULL,
    boundaries = h.boundaries + 1, boundary = 'erase', boundary_seq = c.last_seq,
    strip_through = greatest(h.strip_through, c.last_seq)
FROM conversations c
WHERE h.agent = %(agent)s AND h.channel = %(channel)s
  AND c.agent = h.agent AND c.channel = h.channel;

-- name: erase_pending_notices
-- Notices committed but not yet relayed (the effects outbox) that may tell what was
-- erased: about an erased event, a summary of a touched session, a search's matches.
DELETE FROM effects x
WHERE x.kind = 'notice'
  AND (x.body->>'notice')::jsonb->>'agent' = %(agent)s
  AND (x.body->>'notice')::jsonb->>'channel' = %(channel)s
  AND ((x.body->>'notice')::jsonb->>'event_id' = ANY(%(event_ids)s::text[])
       OR (x.body->>'notice')::jsonb->>'kind' = 'search_results'
       OR %(whole)s
       OR ((x.body->>'notice')::jsonb->>'kind' = 'summary_ready'
           AND (x.body->>'notice')::jsonb->>'session_id' = ANY(%(sessions)s::text[])));

-- name: erase_webhook_deliveries
-- Webhook deliveries (015) of the same notices, delivered or not: each holds its notice as
-- the body it signed (`{"type", "timestamp", "data": <the notice>}`), found by its
-- conversation (021).
DELETE FROM webhook_deliveries w
WHERE w.agent = %(agent)s AND w.channel = %(channel)s
  AND (convert_from(w.payload, 'UTF8')::jsonb->'data'->>'event_id' = ANY(%(event_ids)s::text[])
       OR w.kind = 'search_results'
       OR %(whole)s
       OR (w.kind = 'summary_ready'
           AND convert_from(w.payload, 'UTF8')::jsonb->'data'->>'session_id'
               = ANY(%(sessions)s::text[])));

-- name: erase_marked_conversations
-- The conversations holding events an erase marked (a replay, which has nothing left to
-- redact, settles these).
SELECT DISTINCT channel FROM events
WHERE agent = %(agent)s AND position < %(before)s
  AND payload->'erased'->>'erase_id' = %(erase_id)s;

-- name: erase_exports
-- Export files of the sessions an erase touched (or of a dropped conversation): their
-- names go, and each waits for `contextlog erase` on the host that wrote it.
UPDATE exports SET agent = '', channel = '', session_id = '', erased_at = %(at)s
WHERE agent = %(agent)s AND channel = %(channel)s
  AND (%(whole)s OR session_id = ANY(%(sessions)s::text[]));

-- name: record_export
-- A file `contextlog export` wrote (the same path again: the newer file).
INSERT INTO exports (host, path, agent, channel, session_id, sha256)
VALUES (%(host)s, %(path)s, %(agent)s, %(channel)s, %(session_id)s, %(sha256)s)
ON CONFLICT (host, path) DO UPDATE SET agent = EXCLUDED.agent, channel = EXCLUDED.channel,
    session_id = EXCLUDED.session_id, sha256 = EXCLUDED.sha256, written_at = now(),
    erased_at = NULL;

-- name: erased_exports
-- The files of this host an erase reached.
SELECT path, sha256 FROM exports WHERE host = %(host)s AND erased_at IS NOT NULL ORDER BY path;

-- name: erased_export_paths
-- Every host's files an erase reached that wait to be deleted.
SELECT host, path FROM exports WHERE erased_at IS NOT NULL ORDER BY host, path;

-- name: forget_export
DELETE FROM exports WHERE host = %(host)s AND path = %(path)s;
