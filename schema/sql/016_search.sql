-- Full-text search over the log (issue 34): `search_messages`, one row per message with
-- the words a person would search for, maintained by ingest in the batch's transaction.
--
-- The text search configuration, `contextlog_search`: Postgres' `simple` parser and
-- dictionary (every word lowercased, none stemmed, none dropped as a stop word), with
-- `unaccent` first, so `Café` finds `cafe` and `Straße` finds `strasse`. Why not a
-- language's own configuration (english, french...): a conversation mixes languages, an
-- agent serves people in many, and stemming for one language mangles the others' words
-- (and drops their words that look like its stop words); a per-agent configuration
-- would be a setting to get wrong and a reindex to change. Prefixes (`roll*`) give back
-- most of what stemming would. Han and kana are written without spaces, which the parser
-- cannot split: each of their characters is made a word of its own
-- (`contextlog_search_spaced`), and a query's run of them is a phrase (schema/search.py).
--
-- Which text (`contextlog_search_text`): a string content; text blocks; the string values
-- of tool inputs; tool results' text; documents' titles, context and plain-text sources;
-- search results' titles and text. Not base64 data, signatures, thinking (the model's, not
-- the person's) or compaction summaries (the messages they summarise are there). The first
-- MAX_CHARS characters of a message are indexed (a tsvector holds at most 1 MB).
--
-- Maintenance, right after ingest: a statement trigger on `events` queues each message a
-- batch stores (`search_pending`, in the batch's transaction: none is missed, none twice),
-- and the workers' indexer (worker/tasks/indexer.py, woken by each ingest commit) turns
-- the queue into rows, a few thousand a transaction. Indexing in the batch itself cost
-- ingest half its rate (to_tsvector and the words index: ~34 us a message against ~18 us
-- for the rest of its work); queueing costs ~1 us. The lag (typically under a second) is
-- in `contextlog status`, unhealthy when the queue stops moving. Messages stored before
-- this migration are indexed newest first by the workers' sweep, and all at once by
-- `contextlog rebuild` (`search_backfill`): the migration itself only creates, so ingest
-- waits for it briefly.
--
-- `unaccent` and `btree_gin` are contrib extensions, trusted (a database owner may create
-- them). Where they are missing, search works without accent folding, and the words index
-- is on the words alone (agent scoping is then a filter).

DO $$
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS unaccent;
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'unaccent is not available (%): search will not fold accents', SQLERRM;
    END;
    BEGIN
        CREATE EXTENSION IF NOT EXISTS btree_gin;
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'btree_gin is not available (%): the words index leaves out the agent',
            SQLERRM;
    END;
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_ts_config WHERE cfgname = 'contextlog_search') THEN
        CREATE TEXT SEARCH CONFIGURATION contextlog_search (COPY = simple);
        IF EXISTS (SELECT FROM pg_ts_dict WHERE dictname = 'unaccent') THEN
            ALTER TEXT SEARCH CONFIGURATION contextlog_search
                ALTER MAPPING FOR asciiword, asciihword, hword_asciipart, word, hword,
                                  hword_part, numword, numhword, hword_numpart
                WITH unaccent, simple;
        END IF;
    END IF;
END $$;

-- Han, Hiragana, Katakana and CJK compatibility ideographs set apart by spaces: one word
-- a character (schema/search.py `CJK` holds the same ranges for queries).
-- (ASCII text, most of it, is passed by a cheap look at its length in bytes.)
CREATE OR REPLACE FUNCTION contextlog_search_spaced(t text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(t) > length(t)
                     AND t ~ '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]'
                THEN regexp_replace(t, '([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff])',
                                    ' \1 ', 'g')
                ELSE t END
$$;

-- The searchable text of one content block (see the head of this file).
CREATE OR REPLACE FUNCTION contextlog_block_text(b jsonb)
RETURNS SETOF text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT b->>'text' WHERE b->>'type' = 'text'
    UNION ALL
    SELECT v #>> '{}' FROM jsonb_path_query(b->'input', 'strict $.**') v
    WHERE b->>'type' IN ('tool_use', 'server_tool_use', 'mcp_tool_use')
      AND jsonb_typeof(v) = 'string'
    UNION ALL
    SELECT b->>'content'
    WHERE b->>'type' IN ('tool_result', 'mcp_tool_result')
      AND jsonb_typeof(b->'content') = 'string'
    UNION ALL
    SELECT v #>> '{}' FROM jsonb_path_query(b, 'strict $.content[*] ? (@.type == "text").text') v
    WHERE b->>'type' IN ('tool_result', 'mcp_tool_result', 'search_result')
      AND jsonb_typeof(b->'content') = 'array'
    UNION ALL
    SELECT v #>> '{}' FROM jsonb_path_query(
        b, 'strict $.content[*] ? (@.type == "document" || @.type == "search_result").title') v
    WHERE b->>'type' IN ('tool_result', 'mcp_tool_result')
      AND jsonb_typeof(b->'content') = 'array'
    UNION ALL
    SELECT b->>'title' WHERE b->>'type' IN ('document', 'search_result')
    UNION ALL
    SELECT b->>'context' WHERE b->>'type' = 'document'
    UNION ALL
    SELECT b->'source'->>'data'
    WHERE b->>'type' = 'document' AND b->'source'->>'type' = 'text'
    UNION ALL
    SELECT v #>> '{}' FROM jsonb_path_query(
        b, 'strict $.source.content[*] ? (@.type == "text").text') v
    WHERE b->>'type' = 'document' AND b->'source'->>'type' = 'content'
$$;

-- The searchable text of content blocks, in order.
CREATE OR REPLACE FUNCTION contextlog_blocks_text(content jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT string_agg(t, E'\n' ORDER BY i)
    FROM jsonb_array_elements(content) WITH ORDINALITY AS x(b, i),
         LATERAL contextlog_block_text(x.b) AS t
    WHERE t IS NOT NULL
$$;

-- A message's searchable text (NULL: none, or the message was erased), capped. One
-- expression, so the planner inlines it: a string content (most messages) costs no call.
CREATE OR REPLACE FUNCTION contextlog_search_text(payload jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(CASE
        WHEN payload ? 'erased' THEN NULL
        WHEN jsonb_typeof(payload->'content') = 'string' THEN payload->>'content'
        WHEN jsonb_typeof(payload->'content') = 'array'
            THEN contextlog_blocks_text(payload->'content')
    END, 100000)
$$;

-- The words of a message as `search_messages` keeps them (NULL: nothing to find).
CREATE OR REPLACE FUNCTION contextlog_search_words(payload jsonb)
RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT nullif(to_tsvector('contextlog_search',
                              contextlog_search_spaced(contextlog_search_text(payload))), '')
$$;

-- A search's query for the planner: `to_tsquery` with each prefix operand ('roll':*) also
-- spelled out as the most common words of the index that start with it, which it matches
-- anyway (`( 'roll':* | 'rollback' | 'rolled' )`: the same messages). Postgres estimates
-- a prefix as rare whatever it is, and then reads every match of a common one (`sched*`:
-- 30 ms at 200k events, growing with the log) where the newest-first scan stops after a
-- page's worth; with the common words in it, the estimate tells the two apart. IMMUTABLE
-- on purpose, though it reads pg_stats: so it is folded into the plan as a constant (its
-- answer only ever adds words the prefix already matches, so a stale one is harmless).
CREATE OR REPLACE FUNCTION contextlog_search_query(query text)
RETURNS tsquery LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    q text := to_tsquery('contextlog_search', query)::text;
    quoted text;
    words text;
BEGIN
    -- Each prefix operand as the canonical text writes it: 'lexeme':* (quotes doubled).
    FOR quoted IN SELECT DISTINCT m[1] FROM regexp_matches(q, '(''(?:[^'']|'''')+'')(?=:\*)', 'g') m
    LOOP
        SELECT string_agg(quote_literal(w), ' | ') INTO words FROM (
            SELECT w FROM pg_stats st, unnest(st.most_common_elems::text::text[]) w
            WHERE st.schemaname = current_schema() AND st.tablename = 'search_messages'
              AND st.attname = 'words'
              AND starts_with(w, replace(substr(quoted, 2, length(quoted) - 2), '''''', ''''))
              AND w <> replace(substr(quoted, 2, length(quoted) - 2), '''''', '''')
            ORDER BY w LIMIT 16) common;
        IF words IS NOT NULL THEN
            q := replace(q, quoted || ':*', '( ' || quoted || ':* | ' || words || ' )');
        END IF;
    END LOOP;
    RETURN q::tsquery;
END
$$;

CREATE TABLE IF NOT EXISTS search_messages (
    agent       text        NOT NULL,
    channel     text        NOT NULL,
    seq         bigint      NOT NULL,
    thread      text        NOT NULL,
    position    bigint      NOT NULL,
    recorded_at timestamptz NOT NULL,
    role        text,
    sender      text,
    words       tsvector    NOT NULL,
    PRIMARY KEY (agent, channel, seq)
);
-- Newest first within an agent (a common word: its newest matches, without the index of
-- words), and `since`/`until`.
CREATE INDEX IF NOT EXISTS search_messages_newest_idx
    ON search_messages (agent, recorded_at, position);

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'btree_gin') THEN
        -- Always scoped to an agent: its rows only, a rare word found in a few pages.
        CREATE INDEX IF NOT EXISTS search_messages_words_idx
            ON search_messages USING gin (agent, words);
    ELSE
        CREATE INDEX IF NOT EXISTS search_messages_words_idx
            ON search_messages USING gin (words);
    END IF;
END $$;

-- Each message's search row, as every writer of `search_messages` makes it (its words
-- NULL: nothing to find, not indexed); a simple view, so rows read through it can be
-- locked (the indexer's FOR SHARE).
CREATE OR REPLACE VIEW search_rows AS
SELECT e.agent, e.channel, e.seq, e.thread, e.position, e.recorded_at,
       e.payload->>'role' AS role, e.payload->>'sender' AS sender,
       contextlog_search_words(e.payload) AS words
FROM events e
WHERE e.kind IN ('message.v1', 'imported_message.v1');

-- The messages the indexer has still to index: a heap without an index (the indexer
-- takes rows by ctid), so queueing one costs ingest next to nothing.
CREATE TABLE IF NOT EXISTS search_pending (
    agent   text   NOT NULL,
    channel text   NOT NULL,
    seq     bigint NOT NULL
);

-- The messages one statement inserted, queued for the indexer.
CREATE OR REPLACE FUNCTION contextlog_search_logged()
RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO search_pending (agent, channel, seq)
    SELECT n.agent, n.channel, n.seq FROM logged n
    WHERE n.kind IN ('message.v1', 'imported_message.v1');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS contextlog_search ON events;
CREATE TRIGGER contextlog_search AFTER INSERT ON events
    REFERENCING NEW TABLE AS logged
    FOR EACH STATEMENT EXECUTE FUNCTION contextlog_search_logged();

-- Messages stored before the trigger: positions up to `below` (exclusive) are still to be
-- indexed, newest first (0: done).
CREATE TABLE IF NOT EXISTS search_backfill (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),
    below bigint  NOT NULL
);
INSERT INTO search_backfill (below)
SELECT coalesce(max(position), 0) + 1 FROM events
ON CONFLICT (id) DO NOTHING;
UPDATE search_backfill SET below = 0 WHERE below = 1;
