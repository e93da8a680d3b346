-- Named queries of the threads' segments (migration 014; docs/context.md): the boundaries
-- the command handlers make, and the reads of a thread's context.

-- name: clear_segments
-- A clear (or the clear half of a restore) at seq %(seq)s, time %(at)s: every thread of
-- the conversation starts an empty segment after it. `note`: the header of the new
-- segments (a restore's, an auto-save's), else none; `session`: the restored session whose
-- summary the note tells (an erase or an expiry takes that text out again, 017).
UPDATE threads SET
    seg_start = %(seq)s + 1, seg_base = tokens_through, seg_at = %(at)s,
    seg_restored = NULL, seg_note = %(note)s, note_session = %(note_session)s,
    seg_session = %(session)s,
    seg_summary = NULL, seg_threads = NULL, seg_block = NULL,
    seg_extra = contextlog_header_tokens(%(note)s, NULL, NULL),
    strip_through = %(seq)s, boundaries = boundaries + 1, boundary = %(kind)s,
    boundary_seq = %(seq)s, pending_summary = NULL, pending_through = NULL,
    window_tokens = contextlog_header_tokens(%(note)s, NULL, NULL),
    compacted_through_seq = 0, compaction_summary = NULL
WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: auto_saved_before
-- The session an idle-timeout save made just before a clear at %(seq)s, if one did.
SELECT s.session_id FROM conversations c
JOIN sessions s ON s.agent = c.agent AND s.channel = c.channel AND s.seq = c.last_saved_seq
WHERE c.agent = %(agent)s AND c.channel = %(channel)s AND c.last_saved_seq = %(seq)s - 1
  AND s.auto;

-- name: restored_messages
-- A session's messages as a restore keeps them: what its thread's segment needs.
SELECT seq, thread, tokens, payload->>'role' AS role, payload->'content' AS content
FROM events
WHERE agent = %(agent)s AND channel = %(channel)s AND seq = ANY(%(seqs)s)
ORDER BY seq;

-- name: restore_segment
-- A restored thread: its segment begins with the session's messages `seqs` (their tokens
-- counted as if just before the restore), then what comes after the restore.
INSERT INTO threads AS t (agent, channel, thread, message_count, last_activity_at,
                          seg_start, seg_base, seg_at, seg_restored, seg_note, note_session,
                          seg_extra, strip_through, boundaries, boundary, boundary_seq,
                          window_tokens, seg_threads, seg_session)
VALUES (%(agent)s, %(channel)s, %(thread)s, 0, %(at)s, %(seq)s + 1, -%(tokens)s, %(at)s,
        %(seqs)s, %(note)s, %(note_session)s,
        contextlog_header_tokens(%(note)s, NULL, %(threads)s), %(seq)s, 1, 'restore',
        %(seq)s, %(tokens)s + contextlog_header_tokens(%(note)s, NULL, %(threads)s),
        %(threads)s, %(session_id)s)
ON CONFLICT (agent, channel, thread) DO UPDATE SET
    seg_restored = EXCLUDED.seg_restored,
    seg_base = t.tokens_through - %(tokens)s,
    seg_threads = EXCLUDED.seg_threads,
    seg_extra = EXCLUDED.seg_extra,
    window_tokens = EXCLUDED.window_tokens;

-- name: segment_of
-- A thread's segment as a compaction's handler checks it.
SELECT boundaries, seg_start, seg_extra, seg_note, seg_summary, seg_threads, tokens_through
FROM threads WHERE agent = %(agent)s AND channel = %(channel)s AND thread = %(thread)s;

-- name: compact_segment
-- The API's compaction block replaces exactly the messages the job sent (the thread's
-- segment through seq %(through)s): the context starts with the block, and what came
-- after follows it unchanged, thinking included (the API's background compaction).
UPDATE threads t SET
    seg_start = %(through)s + 1,
    seg_base = coalesce((
        SELECT e.through FROM events e
        WHERE e.agent = t.agent AND e.channel = t.channel AND e.seq <= %(through)s
          AND e.thread = t.thread AND e.kind = 'message.v1' AND e.through IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1), 0),
    seg_restored = NULL, seg_block = %(block)s::jsonb,
    seg_extra = contextlog_header_tokens(t.seg_note, t.seg_summary, t.seg_threads)
                + %(block_tokens)s,
    boundaries = t.boundaries + 1, boundary = 'compaction', boundary_seq = %(seq)s,
    pending_summary = NULL, pending_through = NULL
WHERE t.agent = %(agent)s AND t.channel = %(channel)s AND t.thread = %(thread)s
RETURNING t.thread;

-- name: recount_segment
-- A segment's tokens after its start moved: the thread's total past its base, and the
-- header and block.
UPDATE threads SET window_tokens = tokens_through - seg_base + seg_extra
WHERE agent = %(agent)s AND channel = %(channel)s AND thread = %(thread)s;

-- name: pend_summary
-- Our own summary of a thread's older part (seq <= %(through)s): it lands at the thread's
-- next opening message (`contextlog_segment_steps`, 014), never inside a tool-use cycle.
UPDATE threads SET pending_summary = %(summary)s, pending_through = %(through)s
WHERE agent = %(agent)s AND channel = %(channel)s AND thread = %(thread)s;

-- name: set_frame
-- The bot's frame; answers whether its system or tools changed (a boundary).
UPDATE conversations c SET frame = %(frame)s::jsonb, frame_seq = %(seq)s
FROM (SELECT frame FROM conversations
      WHERE agent = %(agent)s AND channel = %(channel)s) old
WHERE c.agent = %(agent)s AND c.channel = %(channel)s
RETURNING old.frame IS NOT NULL
          AND (old.frame->'system' IS DISTINCT FROM %(frame)s::jsonb->'system'
               OR old.frame->'tools' IS DISTINCT FROM %(frame)s::jsonb->'tools');

-- name: frame_boundary
-- A new system prompt or tool list: the thinking of every earlier turn is bound to the old
-- one, so it is removed from the kept turns (the segments stay as they are).
UPDATE threads SET strip_through = %(seq)s, boundaries = boundaries + 1, boundary = 'frame',
                   boundary_seq = %(seq)s
WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: note_summary
-- A resumed session's summary that landed after the restore: a note at its position in
-- the threads whose header said it was still being written.
INSERT INTO notes (agent, channel, thread, seq, text, session_id)
SELECT agent, channel, thread, %(seq)s, %(text)s, %(session_id)s FROM threads
WHERE agent = %(agent)s AND channel = %(channel)s AND note_session = %(session_id)s
ON CONFLICT DO NOTHING;

-- name: segment_messages
-- A thread's context in one statement (one snapshot): first a row with seq -1 whose
-- content is its segment as JSON (none: the thread has no messages yet, or it crossed a
-- boundary since the reader's last read, %(boundaries)s); then its messages from its
-- segment's start, or from %(from_seq)s (past the last one the reader holds), with the
-- restored ones and our notes, in log order. The range is bounded on both sides by the
-- conversation's seqs (the key's order), and found by the key whatever the segment's age.
WITH t AS (
    SELECT h.seg_start, h.seg_restored, c.last_seq,
           json_build_object(
               'boundaries', h.boundaries, 'seg_start', h.seg_start,
               'strip_through', h.strip_through, 'note', h.seg_note,
               'summary', h.seg_summary, 'threads', h.seg_threads, 'block', h.seg_block,
               'boundary', h.boundary, 'boundary_seq', h.boundary_seq, 'seg_at', h.seg_at,
               'budget', coalesce(c.token_budget, %(default_budget)s),
               'last_seq', c.last_seq, 'frame', c.frame,
               'last_id', (SELECT l.event_id FROM events l
                           WHERE l.agent = c.agent AND l.channel = c.channel
                             AND l.seq = c.last_seq))::text AS segment
    FROM threads h JOIN conversations c ON c.agent = h.agent AND c.channel = h.channel
    WHERE h.agent = %(agent)s AND h.channel = %(channel)s AND h.thread = %(thread)s
      AND (%(boundaries)s::bigint IS NULL OR h.boundaries = %(boundaries)s::bigint)
      -- The reader's last read is of this log: the event it read up to is still there (a
      -- log emptied and written again reuses seqs and boundary counts).
      AND (%(last_id)s::uuid IS NULL OR EXISTS (
          SELECT FROM events l WHERE l.agent = %(agent)s AND l.channel = %(channel)s
            AND l.seq = %(from_seq)s::bigint - 1 AND l.event_id = %(last_id)s::uuid))
)
SELECT -1::bigint AS seq, 0 AS tokens, NULL AS role, t.segment AS content, NULL::uuid
FROM t
UNION ALL
SELECT e.seq, e.tokens, e.payload->>'role', (e.payload->'content')::text, e.event_id
FROM (
    SELECT e.seq, e.tokens, e.thread, e.kind, e.payload, e.event_id FROM events e
    WHERE e.agent = %(agent)s AND e.channel = %(channel)s
      AND e.seq >= greatest((SELECT seg_start FROM t), %(from_seq)s::bigint)
      AND e.seq <= (SELECT last_seq FROM t)
    OFFSET 0
) e
WHERE e.thread = %(thread)s AND e.kind = 'message.v1'
UNION ALL
SELECT e.seq, e.tokens, e.payload->>'role', (e.payload->'content')::text, e.event_id
FROM t JOIN events e
  ON e.agent = %(agent)s AND e.channel = %(channel)s AND e.seq = ANY(t.seg_restored)
WHERE %(from_seq)s::bigint = 0
UNION ALL
SELECT n.seq, length(n.text) / 4, 'system', to_json(n.text)::text, NULL
FROM t JOIN notes n
  ON n.agent = %(agent)s AND n.channel = %(channel)s AND n.thread = %(thread)s
 AND n.seq >= greatest(t.seg_start, %(from_seq)s::bigint)
ORDER BY 1;

-- name: session_created
SELECT created_at, imported_from FROM sessions
WHERE agent = %(agent)s AND channel = %(channel)s AND session_id = %(session_id)s;

-- name: conversation_budget
SELECT coalesce(token_budget, %(default)s) FROM conversations
WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: conversation_source
SELECT source FROM conversations WHERE agent = %(agent)s AND channel = %(channel)s;

-- name: cleared_seq
SELECT cleared_seq FROM conversations WHERE agent = %(agent)s AND channel = %(channel)s;
