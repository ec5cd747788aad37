-- The relay pass, step by step (docs/DESIGN.md §4) ---------------------------------------------------------
--
-- sync.pass() (src/relay/pass.cpp) runs these steps in this order, in one transaction on the session
-- that holds the relay lock, and builds the statements that depend on a codec (re-reading and
-- encoding its noted rows) or on the replicas relation. Every step is set-wise SQL over the pass's
-- working tables (pg_temp.magic_sync_*), which sync_internal.pass_begin() makes once per session. The steps
-- are plpgsql so that each statement's plan is kept for the session, as the pass runs the same
-- statements every time.

-- The end of a replica's generation: its cursors and its outbox go (it is forgotten, alarmed, or
-- provisioned again from nothing). The one place that says what a generation holds.
CREATE FUNCTION sync_internal.end_generation(replicas uuid[]) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM sync.member m USING unnest(end_generation.replicas) AS e(id) WHERE m.replica = e.id;
    DELETE FROM sync.outbox o USING unnest(end_generation.replicas) AS e(id) WHERE o.replica = e.id;
$$;

-- The window rule: how many more messages a replica's outbox takes (magic_sync.window less the
-- unsent ones). A replica's messages go in order, so the unsent ones are those from its first
-- unsent seq to its last (next_seq - 1): two lookups by key, not a count that reads each unsent
-- message (a pass asks it for every cursor behind: 10,000 in a fan-out, where counting took
-- 12 µs each). A message left unsent between sent ones (sync.sent skipped it: another
-- transaction held it) counts as unsent until it goes: the window is never overrun. A body of
-- SQL's standard form, inlined where it is used.
CREATE FUNCTION sync_internal.outbox_room(replica uuid, window_size int) RETURNS bigint
LANGUAGE sql STABLE
RETURN window_size - (SELECT r.next_seq - coalesce((SELECT o.seq FROM sync.outbox o
                                                     WHERE o.replica = r.id AND o.sent_at IS NULL
                                                     ORDER BY o.seq LIMIT 1), r.next_seq)
                      FROM sync.replica r WHERE r.id = outbox_room.replica);

-- Takes the relay lock and readies the working tables: made once per session, emptied at the
-- start of every pass. Not ON COMMIT DELETE ROWS: truncating ten tables at every commit would cost
-- more than a small pass. Nothing vacuums a temporary table and an insert reuses no page that
-- pruning freed, so a table emptied by DELETE grows by what every pass put in it: after some
-- hundred small passes the chunk pick was 60 MB, read from disk in every round. A table past 1 MB
-- is truncated (a new file: a catalog update and an invalidation, too dear for every small pass);
-- the others are emptied by DELETE.
CREATE FUNCTION sync_internal.pass_begin() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    emptied CONSTANT text[] := ARRAY['magic_sync_note', 'magic_sync_row', 'magic_sync_change',
        'magic_sync_replica', 'magic_sync_want', 'magic_sync_need',
        'magic_sync_answer_seen', 'magic_sync_picked', 'magic_sync_written'];
    large text[];
    working_table text;
BEGIN
    PERFORM sync_internal.relay_guard();
    PERFORM sync_internal.relay_lock();
    -- The last table made exists only when all were.
    IF to_regclass('pg_temp.magic_sync_written') IS NULL THEN
        CREATE TEMP TABLE magic_sync_note (codec int NOT NULL, key jsonb);
        CREATE TEMP TABLE magic_sync_row (codec int NOT NULL, key jsonb NOT NULL, k bytea NOT NULL,
            match text NOT NULL, value text, part text NOT NULL, body text, hash bytea);
        CREATE TEMP TABLE magic_sync_change (codec int NOT NULL, key jsonb NOT NULL,
            k bytea NOT NULL, old_scope bigint, old_hash bytea, old_withheld boolean,
            new_scope bigint, new_hash bytea, new_withheld boolean, body text,
            tomb_seq bigint, new_seq bigint, echo_of uuid, echo_prev bigint, at_new boolean);
        CREATE TEMP TABLE magic_sync_replica (id uuid NOT NULL, live boolean NOT NULL,
            part text NOT NULL, groups jsonb NOT NULL, transport text);
        CREATE TEMP TABLE magic_sync_want (replica uuid NOT NULL, match text NOT NULL,
            value text NOT NULL, part text NOT NULL, scope bigint);
        CREATE TEMP TABLE magic_sync_need (replica uuid NOT NULL, scope bigint NOT NULL,
            sent bigint NOT NULL, head bigint NOT NULL, scope_name text NOT NULL, room int NOT NULL,
            in_flight boolean NOT NULL, chunk bigint, chunk_to bigint, chunk_rows int,
            chunk_bytes int);
        -- The answers visible when the pass took its notes: the ones it moves.
        CREATE TEMP TABLE magic_sync_answer_seen (id bigint NOT NULL);
        -- The messages of one step, for sync_internal.enqueue(), which numbers them and empties it.
        CREATE TEMP TABLE magic_sync_enqueue (replica uuid NOT NULL, position bigint NOT NULL,
            kind text NOT NULL, chunks bigint[] NOT NULL DEFAULT '{}',
            reset text[] NOT NULL DEFAULT '{}', drops text[] NOT NULL DEFAULT '{}',
            table_drops text[] NOT NULL DEFAULT '{}', advances jsonb, payload jsonb, body bytea);
        CREATE TEMP TABLE magic_sync_picked (replica uuid NOT NULL, scope bigint NOT NULL,
            chunk bigint NOT NULL, chunk_to bigint NOT NULL);
        -- The replicas the pass wrote messages to (sync_internal.enqueue), for its NOTIFY.
        CREATE TEMP TABLE magic_sync_written (replica uuid PRIMARY KEY);
    END IF;
    SELECT array_agg(t) INTO large FROM unnest(emptied) t
    WHERE pg_relation_size(format('pg_temp.%I', t)::regclass) > 1048576;
    FOREACH working_table IN ARRAY emptied LOOP
        EXECUTE format(CASE WHEN working_table = ANY (large) THEN 'TRUNCATE pg_temp.%I'
                            ELSE 'DELETE FROM pg_temp.%I' END, working_table);
    END LOOP;
END
$$;

-- A temporary table is never analyzed by autovacuum: after one is filled with many rows, it is
-- analyzed, so the next statements join it by plan rather than by guess. `known_rows`: its rows,
-- when the caller counted them. Only the columns the next statements join or filter on: the
-- row count comes with any column, and sorting the sample of the bodies, hashes and jsonb keys
-- (text under the collation) was most of an analyze (12 ms of 10,000 changes, 2 ms without).
CREATE FUNCTION sync_internal.pass_analyze_if_large(working_table text, known_rows bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    large CONSTANT bigint := 1000;
    counted bigint := known_rows;
    columns CONSTANT text := CASE working_table
        WHEN 'magic_sync_note' THEN '(codec)'
        WHEN 'magic_sync_row' THEN '(codec, k, match, value, part)'
        WHEN 'magic_sync_change' THEN '(k, old_scope, new_scope, tomb_seq, at_new)'
        ELSE '' END;
BEGIN
    IF counted IS NULL THEN
        EXECUTE format('SELECT count(*) FROM pg_temp.%I', working_table) INTO counted;
    END IF;
    IF counted > large THEN
        EXECUTE format('ANALYZE pg_temp.%I %s', working_table, columns);
    END IF;
END
$$;

-- A live replica that said it holds a scope it is not a member of is told to drop it (in its
-- next message's drop), once per report: a device recovered to a history where it had not joined
-- that scope yet would keep its rows for ever. A report that crossed the drop of a scope the
-- replica left costs one more drop, which it takes as a no-op.
CREATE FUNCTION sync_internal.pass_drop_foreign_holdings() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH reported AS (DELETE FROM sync.foreign_holding RETURNING replica, scope),
    foreign_scopes AS (
        SELECT f.replica, array_agg(f.scope ORDER BY f.scope) AS scopes
        FROM reported f JOIN sync.replica r ON r.id = f.replica AND r.live
        WHERE NOT f.scope = ANY (r.pending_drops)
          AND NOT EXISTS (SELECT FROM sync.member m JOIN sync.scope s ON s.id = m.scope
                          WHERE m.replica = f.replica
                            AND sync_internal.scope_name(s.match, s.value, s.partition) = f.scope)
        GROUP BY f.replica)
    UPDATE sync.replica r SET pending_drops = r.pending_drops || foreign_scopes.scopes
    FROM foreign_scopes WHERE r.id = foreign_scopes.replica;
END
$$;

-- Devices that may hold what this relay state never sent prove it instead of being sent
-- everything again: each is sent, for every scope whose head it was sent, an empty chunk at that
-- head; it stands there and reports what it holds, and repair (src/verify/repair.sql) resends only
-- the ranges that differ, so a device that matches receives no row. A scope not sent whole yet
-- brings the replica to its head with its next chunk. Two cases:
-- - the cluster's history changed under this relay state (a standby promoted, a base backup
--   recovered to an earlier point): devices may hold messages this state never wrote, or wrote
--   and no longer has, of a history that is gone. Every live replica proves; the origin gets a
--   new id, since the same base backup recovered twice without the archive's timeline history
--   may take the same timeline number again;
-- - a restore's state planned its tables for the first time: the replicas it provisioned
--   meanwhile (sync.replica.proving) are taken as sent everything and prove.
-- Returns the messages queued.
CREATE FUNCTION sync_internal.pass_prove_holdings() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    state sync.relay_state;
    now_in CONSTANT text := sync_internal.history();
BEGIN
    -- No lock: the relay lock holder is its one writer. Most passes end at the first test.
    SELECT * INTO state FROM sync.relay_state;
    IF state.history = now_in AND state.proving_through IS NULL THEN
        RETURN 0;
    END IF;
    IF state.history IS NULL THEN
        -- A state just made (or the update from an earlier release): its origin joins the lineage.
        UPDATE sync.relay_state SET history = now_in;
        INSERT INTO sync.lineage (origin) VALUES (state.origin) ON CONFLICT DO NOTHING;
    ELSIF state.history <> now_in THEN
        UPDATE sync.relay_state SET history = now_in, origin = gen_random_uuid();
        RAISE LOG 'magic_sync: the cluster''s history changed (%, now %): a promoted standby or a point-in-time recovery; every live replica proves what it holds against its scopes'' heads',
                  state.history, now_in;
        -- A device may have been told, in the history that is gone, that rows kept of its
        -- uploads were filed: every upload still kept in part is answered again, as this
        -- history answered it last.
        INSERT INTO sync.answer (replica, kind, payload)
        SELECT u.replica, 'filed', sync_internal.filed_payload(u.id, u.kept)
        FROM sync.upload u WHERE u.kept <> '[]' ORDER BY u.filed_at;
        RETURN sync_internal.send_standing(NULL);
    END IF;
    IF state.proving_through IS NULL
       OR EXISTS (SELECT FROM sync.note n WHERE n.seq <= state.proving_through) THEN
        RETURN 0;
    END IF;
    UPDATE sync.relay_state SET proving_through = NULL;
    UPDATE sync.member m SET sent = s.head
    FROM sync.scope s, sync.replica r
    WHERE s.id = m.scope AND r.id = m.replica AND r.proving;
    RETURN sync_internal.send_standing(
        (SELECT array_agg(r.id) FROM sync.replica r WHERE r.proving));
END
$$;

-- Queues, for each live replica of `replicas` (NULL: every one), a rows message of empty chunks
-- at the heads of the scopes it was sent whole, and ends its proving. Returns the messages queued.
CREATE FUNCTION sync_internal.send_standing(replicas uuid[]) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH standing AS (
        SELECT m.replica, s.id AS scope, s.head,
               sync_internal.scope_name(s.match, s.value, s.partition) AS scope_name
        FROM sync.member m
        JOIN sync.replica r ON r.id = m.replica AND r.live
        JOIN sync.scope s ON s.id = m.scope
        WHERE m.sent = s.head AND (replicas IS NULL OR m.replica = ANY (replicas))),
    built AS (
        INSERT INTO sync.chunk (scope, from_seq, to_seq, built_head, rows, bytes, body)
        SELECT e.scope, e.head, e.head, e.head, 0, octet_length(e.body), e.body
        FROM (SELECT DISTINCT st.scope, st.head,
                     sync_internal.encode_chunk(st.scope_name, st.head, st.head, '{}', '{}', '{}',
                                                '{}', '{}') AS body
              FROM standing st) e
        RETURNING id, scope)
    INSERT INTO pg_temp.magic_sync_enqueue (replica, position, kind, chunks, advances)
    SELECT st.replica, 1, 'rows', array_agg(b.id ORDER BY st.scope),
           jsonb_object_agg(st.scope::text, st.head)
    FROM standing st JOIN built b ON b.scope = st.scope
    GROUP BY st.replica;
    UPDATE sync.replica r SET proving = false
    WHERE r.proving AND (replicas IS NULL OR r.id = ANY (replicas));
    RETURN sync_internal.enqueue();
END
$$;
-- A relay state just made beside declarations it did not plan (pg_restore brings the declarations
-- back, not the relay's rows; so does the update from an earlier release) plans every declared
-- table whole, and the replicas relation, once. Its replicas are provisioned again from that.
-- Not while a capture trigger is missing: pg_restore makes them after it loaded the tables, so a
-- pass in the middle of a restore waits for the rows it would not otherwise be told of.
CREATE FUNCTION sync_internal.pass_note_declarations_once() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE sync.relay_state SET declarations_noted = true
    WHERE NOT declarations_noted
      AND NOT EXISTS (SELECT FROM (SELECT c.relation FROM sync.codec c
                                   UNION ALL
                                   SELECT s.relation FROM sync.replica_set s
                                   JOIN pg_class t ON t.oid = s.relation
                                   WHERE t.relkind IN ('r', 'p')) d  -- a view has none
                      WHERE NOT sync_internal.capture_installed(d.relation));
    IF FOUND THEN
        INSERT INTO sync.note (codec, key)
        SELECT c.id, NULL::jsonb FROM sync.codec c
        UNION ALL
        SELECT 0, NULL FROM sync.replica_set;
        -- A restore's state (the dump brought the lineage of earlier ones): the replicas it
        -- provisions until these notes are planned prove what they hold instead of a full resend.
        IF EXISTS (SELECT FROM sync.lineage l JOIN sync.relay_state r ON l.origin <> r.origin) THEN
            UPDATE sync.relay_state SET proving_through = (SELECT max(n.seq) FROM sync.note n);
        END IF;
    END IF;
END
$$;

-- Whether a row is withheld depends on magic_sync.bytes_per_message: when it changed, the rows
-- whose flag it changed are noted, so the pass plans them again (sent, or withheld, and their
-- scopes' fingerprints with them).
CREATE FUNCTION sync_internal.pass_note_rows_the_limit_changed(message_bytes int) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH changed AS (UPDATE sync.relay_state SET bytes_per_message = message_bytes
                     WHERE bytes_per_message IS DISTINCT FROM message_bytes RETURNING 1)
    INSERT INTO sync.note (codec, key)
    SELECT r.codec, r.key FROM sync.row r
    JOIN sync.codec c ON c.id = r.codec JOIN sync.scope s ON s.id = r.scope
    WHERE EXISTS (SELECT FROM changed) AND NOT r.gone
      AND r.withheld = sync_internal.row_travels(sync_internal.scope_name(s.match, s.value, s.partition),
                                        c.table_name, sync_internal.canonical(r.key), r.body);
END
$$;

-- Codecs that ended (sync.dropped_codec): their rows leave the relay's state and their scopes'
-- fingerprints, and every live replica that is a member of a scope that held some is told to drop
-- the table (the name its rows travelled under). Each such scope gets a new head: a chunk built
-- over those rows is not reused, and a holding reported before is not compared again. What was
-- set aside of them goes too; their notes, if any are left, are taken and find no codec.
CREATE FUNCTION sync_internal.pass_forget_dropped_codecs() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    forgotten int[];
BEGIN
    -- Nearly every pass has nothing dropped, and the statement below still reads sync.row whole
    -- to join it with nothing (49 ms a pass at 100,000 rows).
    IF NOT EXISTS (SELECT FROM sync.dropped_codec) THEN
        RETURN;
    END IF;
    WITH dropped AS (DELETE FROM sync.dropped_codec RETURNING codec, table_name),
    echoes AS (DELETE FROM sync.echo e USING dropped d WHERE e.codec = d.codec),
    gone AS (DELETE FROM sync.row r USING dropped d WHERE r.codec = d.codec
             RETURNING r.scope, r.k, r.hash, r.gone OR r.withheld AS uncounted, d.table_name),
    per_scope AS (SELECT scope,
                  sync_internal.fp_sum(sync_internal.fp_element(k, hash)) FILTER (WHERE NOT uncounted) AS minus,
                  count(*) FILTER (WHERE NOT uncounted) AS dn,
                  array_agg(DISTINCT table_name) AS tables
                  FROM gone GROUP BY scope),
    scopes AS (UPDATE sync.scope s
               SET fp = sync_internal.fp_sub(s.fp, coalesce(p.minus, sync_internal.fp_zero())),
                   n = s.n - p.dn, head = nextval('sync.row_seq')
               FROM per_scope p WHERE s.id = p.scope),
    told AS (SELECT m.replica, array_agg(DISTINCT t) AS tables
             FROM sync.member m JOIN per_scope p ON p.scope = m.scope, unnest(p.tables) t
             GROUP BY m.replica),
    dropping AS (UPDATE sync.replica r
                 SET pending_table_drops = ARRAY(SELECT DISTINCT x
                     FROM unnest(r.pending_table_drops || t.tables) x ORDER BY x)
                 FROM told t WHERE r.id = t.replica AND r.live)
    SELECT array_agg(codec) INTO forgotten FROM dropped;
    IF forgotten IS NOT NULL THEN
        PERFORM sync_internal.release_codecs(forgotten);
    END IF;
END
$$;

-- 1. Takes the oldest visible notes until they hold notes_per_pass keys: the note that goes past
-- the bound is taken in part, and what is left of it waits for the next pass. A key noted twice is
-- in pg_temp.magic_sync_note twice: every statement that reads it takes its keys DISTINCT (and
-- the notes of the replicas set aside, and of whole tables, were never de-duplicated against it). The answers visible then are the ones this pass moves: an upload's notes and
-- answer commit together, so a pass moves an answer only with the changes it filed (an answer
-- moved before them, by a pass that began before they committed, left its row to be sent back to
-- the replica that filed it: the end-to-end test saw it now and then). Returns the number of keys
-- taken.
CREATE FUNCTION sync_internal.pass_take_notes(notes_per_pass bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cut_note bigint;   -- the first note past the bound
    inside bigint;     -- how many of its keys are inside it
    whole bigint;      -- the keys of the notes before it
BEGIN
    SELECT s.seq, notes_per_pass - (s.upto - s.key_count) INTO cut_note, inside
    FROM (SELECT n.seq, n.key_count, sum(n.key_count) OVER (ORDER BY n.seq) AS upto
          FROM sync.note n) s
    WHERE s.upto > notes_per_pass ORDER BY s.seq LIMIT 1;
    inside := coalesce(inside, 0);
    -- The notes before the cut, whole, and the first keys of the cut note, in one statement, not
    -- de-duplicated here: the statement that encodes a codec's rows takes its keys DISTINCT anyway
    -- (a UNION here hashed every key a second time, 4 ms of a pass of 10,000; an EXCEPT against
    -- what an earlier statement inserted held every key in memory).
    WITH taken AS (DELETE FROM sync.note WHERE seq < coalesce(cut_note, 9223372036854775807)
                   RETURNING codec, key, keys, key_count),
    kept AS (INSERT INTO pg_temp.magic_sync_note (codec, key)
             SELECT t.codec, t.key FROM taken t WHERE t.keys IS NULL
             UNION ALL SELECT t.codec, k.key FROM taken t
             CROSS JOIN LATERAL sync.note_keys(t.keys) AS k(key)
             UNION ALL SELECT n.codec, k.key FROM sync.note n
             CROSS JOIN LATERAL sync.note_keys(n.keys, inside::int) AS k(key)
             WHERE n.seq = cut_note AND inside > 0),
    seen AS (INSERT INTO pg_temp.magic_sync_answer_seen SELECT id FROM sync.answer)
    SELECT coalesce(sum(key_count), 0)::bigint INTO whole FROM taken;
    -- A note of one key (or of a whole table) is never cut: its `inside` is 0.
    IF inside > 0 THEN
        UPDATE sync.note SET keys = sync_internal.note_keys_from(keys, inside::int + 1),
                             key_count = key_count - inside::int
        WHERE seq = cut_note;
    END IF;
    RETURN whole + inside;
END
$$;

-- The declared replicas relation (none: no row), as the pass reads it: the relation, its name, its
-- `live` expression, its partition column, whether it is a view (re-read every
-- magic_sync.replica_scan, `scan_due`).
CREATE FUNCTION sync_internal.pass_replica_set(replica_scan_s int)
RETURNS TABLE (relation text, relation_name text, live text, partitioned_by text,
               transport text, is_view boolean, scan_due boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.relation::regclass::text, s.relation_name, s.live, s.partitioned_by, s.transport,
           c.relkind NOT IN ('r', 'p'),
           coalesce(st.replicas_scanned_at < now() - make_interval(secs => replica_scan_s), true)
    FROM sync.replica_set s JOIN pg_class c ON c.oid = s.relation
    CROSS JOIN sync.relay_state st
$$;

-- Notes every replica the relation lists and every one the relay knows, to be looked at again.
CREATE FUNCTION sync_internal.pass_note_every_replica() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('INSERT INTO pg_temp.magic_sync_note (codec, key)
                    SELECT 0, jsonb_build_object(''id'', t.id) FROM %s t
                    UNION SELECT 0, jsonb_build_object(''id'', r.id) FROM sync.replica r',
                   (SELECT s.relation::regclass FROM sync.replica_set s));
END
$$;

-- A replicas relation that is a view is read again every magic_sync.replica_scan: every replica
-- is noted.
CREATE FUNCTION sync_internal.pass_scan_replica_view() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sync_internal.pass_note_every_replica();
    UPDATE sync.relay_state SET replicas_scanned_at = now();
END
$$;

-- 2. A note with no key means every row of its codec: what the table has now and what the relay
-- last planned for it. Codec 0 is the replicas relation: every replica.
CREATE FUNCTION sync_internal.pass_expand_whole_notes(replicas_declared boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    whole record;
BEGIN
    FOR whole IN
        SELECT DISTINCT n.codec, c.relation::regclass::text AS relation,
                        c.key_columns::text[] AS key_columns
        FROM pg_temp.magic_sync_note n LEFT JOIN sync.codec c ON c.id = n.codec
        WHERE n.key IS NULL
    LOOP
        IF whole.codec = 0 THEN
            IF replicas_declared THEN
                PERFORM sync_internal.pass_note_every_replica();
            END IF;
        ELSIF whole.relation IS NOT NULL THEN
            -- Key column names were validated when declared.
            EXECUTE format('INSERT INTO pg_temp.magic_sync_note (codec, key)
                            SELECT $1, jsonb_build_object(%s) FROM %s t
                            UNION SELECT $1, r.key FROM sync.row r
                            WHERE r.codec = $1 AND NOT r.gone',
                           (SELECT string_agg(format('%L, t.%I', k.name, k.name), ', '
                                              ORDER BY k.position)
                            FROM unnest(whole.key_columns) WITH ORDINALITY k(name, position)),
                           whole.relation)
            USING whole.codec;
        END IF;
    END LOOP;
    DELETE FROM pg_temp.magic_sync_note WHERE key IS NULL;
END
$$;

-- Whether the notes taken name any replica, to be looked at again.
CREATE FUNCTION sync_internal.pass_replicas_noted() RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM pg_temp.magic_sync_note WHERE codec = 0);
END
$$;

-- 3. Replicas (pg_temp.magic_sync_replica holds each noted one as its relation has it now).
-- Each takes the transport its row names; replicas no longer live are forgotten. Returns how many.
CREATE FUNCTION sync_internal.pass_forget_replicas() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gone uuid[];
BEGIN
    -- The transport that delivers each one, as its row says now.
    UPDATE sync.replica r SET transport = p.transport FROM pg_temp.magic_sync_replica p
    WHERE p.id = r.id AND r.transport IS DISTINCT FROM p.transport;
    WITH forgotten AS (UPDATE sync.replica r SET live = false FROM pg_temp.magic_sync_replica p
                       WHERE p.id = r.id AND NOT p.live AND r.live RETURNING r.id)
    SELECT array_agg(id) INTO gone FROM forgotten;
    IF gone IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM sync_internal.end_generation(gone);
    RETURN cardinality(gone);
END
$$;

-- The scopes each live replica belongs to: all of its partition, its own, one per group column.
CREATE FUNCTION sync_internal.pass_want_scopes() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pg_temp.magic_sync_want (replica, match, value, part)
    SELECT id, '*', '', part FROM pg_temp.magic_sync_replica WHERE live
    UNION ALL SELECT id, 'id', id::text, part FROM pg_temp.magic_sync_replica WHERE live
    UNION ALL SELECT p.id, g.key, g.value, p.part FROM pg_temp.magic_sync_replica p,
    jsonb_each_text(p.groups) g WHERE p.live AND g.value IS NOT NULL;
    INSERT INTO sync.scope (match, value, partition)
    SELECT DISTINCT match, value, part FROM pg_temp.magic_sync_want
    ON CONFLICT (match, value, partition) DO NOTHING;
    UPDATE pg_temp.magic_sync_want w SET scope = s.id FROM sync.scope s
    WHERE s.match = w.match AND s.value = w.value AND s.partition = w.part;
END
$$;

-- A replica that becomes live, or moves to another partition, starts over: a new generation,
-- nothing sent, a reset first. Returns how many.
CREATE FUNCTION sync_internal.pass_provision_replicas() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    provisioned uuid[];
BEGIN
    WITH fresh AS (INSERT INTO sync.replica AS r (id, gen, live, partition, reset_pending, proving,
                                                  transport)
                   SELECT p.id, 1, true, p.part, NOT restored, restored, p.transport
                   FROM pg_temp.magic_sync_replica p
                   CROSS JOIN (SELECT s.proving_through IS NOT NULL AS restored
                               FROM sync.relay_state s) state
                   LEFT JOIN sync.replica x ON x.id = p.id
                   WHERE p.live AND (x.id IS NULL OR NOT x.live OR x.partition <> p.part)
                   ON CONFLICT (id) DO UPDATE SET gen = r.gen + 1, live = true,
                   partition = excluded.partition, provisioned_at = now(), reset_pending = true,
                   proving = false,
                   pending_drops = '{}', pending_table_drops = '{}'
                   RETURNING r.id)
    SELECT array_agg(id) INTO provisioned FROM fresh;
    IF provisioned IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM sync_internal.end_generation(provisioned);
    -- A row set aside because it named a replica nobody listed may name one of these.
    INSERT INTO pg_temp.magic_sync_note (codec, key)
    SELECT codec, key FROM sync.set_aside WHERE kind = 'note';
    RETURN cardinality(provisioned);
END
$$;

-- Scopes a live replica no longer belongs to are left, and named in its next message's drop;
-- the ones it newly belongs to are joined at cursor 0. A chunk that left out a row its only
-- member had uploaded must not reach a member that joins: its scope's chunks over such rows are
-- reused no more.
CREATE FUNCTION sync_internal.pass_move_members() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH left_scopes AS (DELETE FROM sync.member m USING pg_temp.magic_sync_replica p
                         WHERE m.replica = p.id AND p.live
                         AND NOT EXISTS (SELECT FROM pg_temp.magic_sync_want w
                                         WHERE w.replica = m.replica AND w.scope = m.scope)
                         RETURNING m.replica, m.scope),
    names AS (SELECT l.replica,
              array_agg(sync_internal.scope_name(s.match, s.value, s.partition) ORDER BY s.id) AS scopes
              FROM left_scopes l JOIN sync.scope s ON s.id = l.scope GROUP BY l.replica)
    UPDATE sync.replica r SET pending_drops = r.pending_drops || names.scopes
    FROM names WHERE r.id = names.replica;
    WITH joined AS (INSERT INTO sync.member (replica, scope) SELECT replica, scope
                    FROM pg_temp.magic_sync_want ON CONFLICT (replica, scope) DO NOTHING
                    RETURNING scope)
    UPDATE sync.chunk c SET built_head = -1
    WHERE c.scope IN (SELECT scope FROM joined) AND c.built_head >= 0
      AND EXISTS (SELECT FROM sync.row r WHERE r.scope = c.scope AND r.echo_of IS NOT NULL
                  AND r.seq > c.from_seq AND r.seq <= c.to_seq);
END
$$;

-- 4. The codecs the notes name (their columns: sync_internal.codec_columns).
CREATE FUNCTION sync_internal.pass_noted_codecs() RETURNS bigint[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(DISTINCT n.codec), '{}') FROM pg_temp.magic_sync_note n);
END
$$;

-- A codec's noted keys, one by one, for a codec whose rows failed to encode as a set.
CREATE FUNCTION sync_internal.pass_noted_keys(codec int) RETURNS SETOF jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT DISTINCT n.key FROM pg_temp.magic_sync_note n
                 WHERE n.codec = pass_noted_keys.codec;
END
$$;

-- Rows of an `own` codec (`to_column` names the replica) whose replica the relation does not list
-- are set aside, not planned. Returns how many.
CREATE FUNCTION sync_internal.pass_set_aside_unknown_replicas(codec int, to_column text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    replicas regclass;
    replicas_name text;
    kept bigint;
BEGIN
    SELECT s.relation, s.relation_name INTO replicas, replicas_name FROM sync.replica_set s;
    EXECUTE format('WITH unknown AS (DELETE FROM pg_temp.magic_sync_row p WHERE p.codec = $1
                    AND p.body IS NOT NULL
                    AND NOT EXISTS (SELECT FROM %s r WHERE r.id::text = p.value)
                    RETURNING p.codec, p.key, p.value)
                    SELECT sync_internal.keep(''note'', array_agg(codec), array_agg(key),
                      array_agg(format(''%%s names replica %%s, which %%s does not list'',
                                       $2, value, $3)))
                    FROM unknown HAVING count(*) > 0', replicas)
    INTO kept USING codec, to_column, replicas_name;
    RETURN coalesce(kept, 0);
END
$$;

-- Changes that are a replica's own upload, as that replica holds the row once it takes the
-- answer: the version it had (this row's previous version, in the same scope) with the upload
-- over it, equal to the version planned now. Only while the answer is still to be moved (by this
-- pass, after the changes): the messages that carried the previous version then come before the
-- answer, so the replica holds it when it takes the answer. A row uploaded twice (two writes, or
-- two replicas) before the pass is sent back. Whether the row goes back to the replica is decided
-- per message (sync_internal.pass_build_chunks).
CREATE FUNCTION sync_internal.pass_mark_echoes() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pg_temp.magic_sync_change c SET echo_of = e.replica, echo_prev = r.seq
    FROM sync.echo e, sync.row r
    WHERE e.codec = c.codec AND e.key = c.key AND c.old_scope = c.new_scope
      AND r.k = c.k AND r.scope = c.old_scope AND NOT r.gone
      AND c.body = sync_internal.canonical(r.body::jsonb || e.body)
      AND NOT EXISTS (SELECT FROM sync.echo other WHERE other.codec = e.codec
                      AND other.key = e.key AND other.id <> e.id)
      AND EXISTS (SELECT FROM sync.answer a WHERE a.replica = e.replica
                  AND a.payload->>'upload' = e.upload::text);
END
$$;

-- 5. Compares the rows encoded (pg_temp.magic_sync_row) with what the relay planned before: the
-- differences go to pg_temp.magic_sync_change, with new seqs, and whether sync.row has a version
-- of the row in its new scope already (`at_new`: the live one, or the tombstone left there when
-- the row went or moved away), which the change replaces; the others are inserted. A join, not a
-- lookup per row: the planner reads the tombstones as a set or by key, as their count says.
-- Returns how many.
CREATE FUNCTION sync_internal.pass_find_changes() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    changed bigint;
BEGIN
    -- A note set aside is planned now.
    PERFORM sync_internal.release_planned(array_agg(p.codec), array_agg(p.key))
    FROM pg_temp.magic_sync_row p JOIN sync.set_aside s
      ON s.kind = 'note' AND s.codec = p.codec AND s.key = p.key
    HAVING count(*) > 0;
    INSERT INTO sync.scope (match, value, partition)
    SELECT DISTINCT match, value, part FROM pg_temp.magic_sync_row WHERE body IS NOT NULL
    ON CONFLICT (match, value, partition) DO NOTHING;
    INSERT INTO pg_temp.magic_sync_change (codec, key, k, old_scope, old_hash, old_withheld,
                                           new_scope, new_hash, new_withheld, body, tomb_seq,
                                           new_seq, at_new)
    SELECT p.codec, p.key, p.k, r.scope, r.hash, r.withheld, s.id, p.hash, w.withheld, p.body,
           CASE WHEN r.scope IS NOT NULL AND r.scope IS DISTINCT FROM s.id
                THEN nextval('sync.row_seq') END,
           CASE WHEN s.id IS NOT NULL THEN nextval('sync.row_seq') END,
           CASE WHEN s.id IS NOT NULL THEN r.scope IS NOT DISTINCT FROM s.id OR g.k IS NOT NULL END
    FROM pg_temp.magic_sync_row p
    LEFT JOIN sync.scope s ON p.body IS NOT NULL AND s.match = p.match
     AND s.value = p.value AND s.partition = p.part
    LEFT JOIN sync.row r ON r.k = p.k AND NOT r.gone
    LEFT JOIN sync.row g ON g.k = p.k AND g.scope = s.id AND g.gone
    CROSS JOIN LATERAL (SELECT s.id IS NOT NULL AND NOT sync_internal.row_travels(
     sync_internal.scope_name(s.match, s.value, s.partition), c.table_name, sync_internal.canonical(p.key),
     p.body) AS withheld FROM sync.codec c WHERE c.id = p.codec) w
    WHERE r.scope IS DISTINCT FROM s.id OR r.hash IS DISTINCT FROM p.hash
       OR coalesce(r.withheld, false) <> w.withheld;
    GET DIAGNOSTICS changed = ROW_COUNT;
    -- A row set aside as withheld is released when it changed (sent, or withheld anew); planned
    -- again unchanged, it stays withheld and set aside.
    PERFORM sync_internal.release_planned(array_agg(c.codec), array_agg(c.key))
    FROM pg_temp.magic_sync_change c JOIN sync.set_aside s
      ON s.kind = 'row' AND s.codec = c.codec AND s.key = c.key
    HAVING count(*) > 0;
    IF EXISTS (SELECT FROM sync.echo) THEN
        IF changed > 0 THEN
            PERFORM sync_internal.pass_mark_echoes();
        END IF;
        DELETE FROM sync.echo e USING pg_temp.magic_sync_row p
        WHERE e.codec = p.codec AND e.key = p.key;
    END IF;
    RETURN changed;
END
$$;

-- Records the changes found: tombstones where rows went or moved, the rows' new versions, and
-- every scope's fingerprint and head. A new version replaces the one at its key and scope
-- (`at_new`) or is inserted: an insert ON CONFLICT paid a speculative insertion for every row
-- (the key probed before the insert, the tuple confirmed after it), where the pass, the only
-- writer of sync.row's versions (under the relay lock), knows which are there: the 100,000 new
-- rows of bench-relay (a) were 630 ms of upsert, now 420 ms of insert (pg_stat_statements), the
-- comparison that finds them 40 ms dearer. A tombstone that sync.prune() removed since the
-- comparison saw it is replaced by nothing: that version is inserted.
CREATE FUNCTION sync_internal.pass_record_changes() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE sync.row r SET gone = true, seq = c.tomb_seq, hash = NULL, body = NULL,
                          withheld = false, echo_of = NULL, echo_prev = NULL
    FROM pg_temp.magic_sync_change c WHERE c.tomb_seq IS NOT NULL
      AND r.k = c.k AND r.scope = c.old_scope;
    WITH replaced AS (
        UPDATE sync.row r SET seq = c.new_seq, hash = c.new_hash, body = c.body, gone = false,
            withheld = c.new_withheld, echo_of = c.echo_of, echo_prev = c.echo_prev
        FROM pg_temp.magic_sync_change c WHERE c.at_new AND r.k = c.k AND r.scope = c.new_scope
        RETURNING r.k, r.scope)
    INSERT INTO sync.row (codec, key, k, scope, seq, hash, body, gone, withheld, echo_of,
                          echo_prev)
    SELECT c.codec, c.key, c.k, c.new_scope, c.new_seq, c.new_hash, c.body, false, c.new_withheld,
           c.echo_of, c.echo_prev
    FROM pg_temp.magic_sync_change c WHERE c.new_scope IS NOT NULL
      AND NOT EXISTS (SELECT FROM replaced x WHERE x.k = c.k AND x.scope = c.new_scope);
    WITH d AS (
        SELECT old_scope AS scope,
               CASE WHEN NOT old_withheld THEN sync_internal.fp_element(k, old_hash) END AS e,
               CASE WHEN old_withheld THEN 0 ELSE -1 END AS sign, tomb_seq AS seq
        FROM pg_temp.magic_sync_change WHERE old_scope IS NOT NULL
        UNION ALL
        SELECT new_scope, CASE WHEN NOT new_withheld THEN sync_internal.fp_element(k, new_hash) END,
               CASE WHEN new_withheld THEN 0 ELSE 1 END, new_seq
        FROM pg_temp.magic_sync_change WHERE new_scope IS NOT NULL),
    per_scope AS (SELECT scope,
                  coalesce(sync_internal.fp_sum(e) FILTER (WHERE sign = 1), sync_internal.fp_zero()) AS plus,
                  coalesce(sync_internal.fp_sum(e) FILTER (WHERE sign = -1), sync_internal.fp_zero()) AS minus,
                  sum(sign) AS dn, max(seq) AS head FROM d GROUP BY scope)
    UPDATE sync.scope s SET fp = sync_internal.fp_sub(sync_internal.fp_add(s.fp, p.plus), p.minus),
                            n = s.n + p.dn, head = greatest(s.head, coalesce(p.head, 0))
    FROM per_scope p WHERE s.id = p.scope;
END
$$;

-- Scopes the truth audit found drifted from their tables (sync.drifted_scope): their running
-- fingerprints counted again from sync.row, which the codecs the audit noted whole plan again.
-- Their head stays where it was, so the reports at it are no longer settled: compared with the
-- fingerprint counted again, they may differ.
CREATE FUNCTION sync_internal.pass_recount_drifted_scopes() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH drifted AS (DELETE FROM sync.drifted_scope RETURNING scope),
    counted AS (SELECT d.scope,
                coalesce(sync_internal.fp_sum(sync_internal.fp_element(r.k, r.hash)), sync_internal.fp_zero()) AS fp,
                count(r.k) AS n
                FROM drifted d LEFT JOIN sync.row r ON r.scope = d.scope
                 AND NOT r.gone AND NOT r.withheld
                GROUP BY d.scope),
    recounted AS (UPDATE sync.scope s SET fp = c.fp, n = c.n FROM counted c WHERE s.id = c.scope
                  RETURNING sync_internal.scope_name(s.match, s.value, s.partition) AS name)
    UPDATE sync.holding h SET settled = false FROM recounted WHERE h.scope = recounted.name AND h.settled;
END
$$;

-- Confirmations left by sync.receive(): messages a replica applied leave its outbox and confirm
-- the cursors they carried, whether or not the sender has recorded them as sent yet (a replica
-- may apply and confirm a message before its sender's sync.sent() commits). All but one: a head
-- whose lease holds (sync_internal.lease_holds: its time has not run out and its sender's session lives)
-- stays until its sender records it or the lease ends, because its lease covers the run the
-- sender is still sending; pruned, it would leave the rest of the run unleased for another sender
-- to take while this one sends it. The confirmation stays for the next pass.
-- The lease is tested on the row the delete finds, so a lease taken since the statement began
-- keeps its row too; what was kept is what the statement saw in range less what it deleted.
CREATE FUNCTION sync_internal.pass_apply_confirmations() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH c AS (DELETE FROM sync.confirmation RETURNING replica, applied),
    latest AS (SELECT replica, max(applied) AS applied FROM c GROUP BY replica),
    done AS (DELETE FROM sync.outbox o USING latest l WHERE o.replica = l.replica
             AND o.seq <= l.applied AND NOT sync_internal.lease_holds(o)
             RETURNING o.replica, o.advances),
    pruned AS (SELECT replica, count(*) AS n FROM done GROUP BY replica),
    kept AS (INSERT INTO sync.confirmation (replica, applied)
             SELECT l.replica, l.applied FROM latest l LEFT JOIN pruned p ON p.replica = l.replica
             WHERE (SELECT count(*) FROM sync.outbox o WHERE o.replica = l.replica
                    AND o.seq <= l.applied) > coalesce(p.n, 0)),
    advanced AS (SELECT d.replica, a.key::bigint AS scope, max(a.value::bigint) AS through
                 FROM done d, jsonb_each_text(coalesce(d.advances, '{}')) a GROUP BY 1, 2)
    UPDATE sync.member m SET confirmed = greatest(m.confirmed, a.through)
    FROM advanced a WHERE m.replica = a.replica AND m.scope = a.scope;
END
$$;

-- 6. One round of messages begins: the cursors that are behind their scope's head, of the
-- replicas with room in their window (sync_internal.outbox_room), and whether a sender is delivering to
-- the replica (a lease holds). After the first round, `written_only`: only the replicas this pass
-- wrote to (pg_temp.magic_sync_written), the only ones a round of this pass can have changed; a
-- window a sender's sync.sent opened meanwhile waits for the next pass, which that sync.sent
-- wakes (in a fan-out to 10,000 replicas every round looked at every cursor behind again: 49 ms
-- a round, three rounds a pass).
CREATE FUNCTION sync_internal.pass_find_needs(window_size int, written_only boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Emptied by DELETE: the pass truncated whichever had grown large when it began, and a round
    -- adds at most the rows of the chunks the pass's rounds send.
    DELETE FROM pg_temp.magic_sync_need;
    DELETE FROM pg_temp.magic_sync_picked;
    -- The cursors behind first (OFFSET 0 keeps them apart): each one's room is looked up, not
    -- every member's (at 10,000 idle replicas, 20,000 lookups were most of a pass); then the
    -- scope's name and whether a sender is delivering, only for those with room (OFFSET 0 again:
    -- in a fan-out to 10,000 replicas nearly every cursor is behind and nearly every window full,
    -- and a pass's every round looked at each one's name and leases too).
    INSERT INTO pg_temp.magic_sync_need (replica, scope, sent, head, scope_name, room, in_flight)
    SELECT b.replica, b.scope, b.sent, b.head, sync_internal.scope_name(b.match, b.value, b.partition),
           b.room,
           coalesce((SELECT bool_or(sync_internal.lease_holds(o)) FROM sync.outbox o
                     WHERE o.replica = b.replica AND o.sent_at IS NULL), false)
    FROM (SELECT behind.*, sync_internal.outbox_room(behind.replica, window_size) AS room
          FROM (SELECT m.replica, m.scope, m.sent, s.head, s.match, s.value, s.partition
                FROM sync.member m JOIN sync.scope s ON s.id = m.scope
                WHERE m.sent < s.head
                  AND (NOT written_only
                       OR m.replica IN (SELECT w.replica FROM pg_temp.magic_sync_written w))
                OFFSET 0) behind
          OFFSET 0) b
    -- The replica of each cursor with room, by key (not a hash of every replica).
    CROSS JOIN LATERAL (SELECT FROM sync.replica r
                        WHERE r.id = b.replica AND r.live AND NOT r.proving OFFSET 0) sendable
    WHERE b.room > 0;
END
$$;

-- The newest chunk built from each needed cursor whose scope has not moved since, attached to the
-- needs that have none yet. Returns whether some need is left without one.
CREATE FUNCTION sync_internal.pass_attach_chunks() RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pg_temp.magic_sync_need n SET chunk = c.id, chunk_to = c.to_seq,
        chunk_rows = c.rows, chunk_bytes = c.bytes
    FROM (SELECT DISTINCT ON (c.scope, c.from_seq) c.id, c.scope, c.from_seq,
          c.to_seq, c.rows, c.bytes FROM sync.chunk c
          JOIN sync.scope s ON s.id = c.scope AND s.head = c.built_head
          WHERE (c.scope, c.from_seq) IN (SELECT scope, sent FROM pg_temp.magic_sync_need)
          ORDER BY c.scope, c.from_seq, c.to_seq DESC) c
    WHERE n.chunk IS NULL AND c.scope = n.scope AND c.from_seq = n.sent;
    RETURN EXISTS (SELECT FROM pg_temp.magic_sync_need WHERE chunk IS NULL);
END
$$;

-- Chunks for every distinct (scope, cursor) that replicas need and that is not built yet: the
-- rows after the cursor in seq order, cut at the row and byte limits. A row too big for any
-- message is withheld and set aside.
--
-- Where the replicas at a cursor have room for more messages, and the pass rounds left for them,
-- the chunks after the first are built too, up to `ahead` in all, each starting where the one
-- before ended, so the next rounds find them built. A chunk of that run must hold exactly the
-- rows that building it from its own start would: it is built only after a cursor past 0 (from 0,
-- tombstones are left out, after it they travel), while no chunk before it was cut short by the
-- byte limit (the next one starts at a row-limit boundary), and where it holds no replica's echo
-- (whether an echo is sent back depends on the cursor) and fits the byte limit whole.
--
-- Picked in runs of rows_per_message rows (grp); the first run is cut as its rows are picked:
-- rows that fit, in order, until the running size passes the budget; the rows from there on are
-- dropped, but never the first, so that a chunk always moves on (a withheld row's note, its key
-- named by its hash when need be, fits any but the smallest limits). A row too big for any
-- message takes no room: it is withheld. The row's size is worked out where its key is encoded
-- (OFFSET 0: pulled up, the key was encoded once for the row and again for its size).
--
-- Then, in the same statement, the chunks of the rows picked (written to a working table and read
-- back, the rows picked cost about a fifth of building their chunks). A chunk covers the scope up
-- to its head, or up to its last row when it was cut short. Its rows are aggregated in one order,
-- unsorted, and put in seq order by sync_internal.encode_chunk: five aggregates each sorting its
-- own input cost more than the encoding. The rows withheld from the chunks built are set aside;
-- returns how many.
CREATE FUNCTION sync_internal.pass_build_chunks(rows_limit int, bytes_limit int, ahead int)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    withheld_rows bigint;
BEGIN
    WITH picked (origin, scope, grp, head, scope_name, budget, seq, codec, key, table_name, ktext,
                 body, hash, size, fits, dropped, last_fetched, echo) AS MATERIALIZED (
      SELECT p.origin, p.scope, p.grp, p.head, p.scope_name, p.budget, p.seq, p.codec, p.key,
      p.table_name, p.ktext, p.body, p.hash, p.size, p.fits, CASE WHEN p.grp = 0 THEN
       p.position > 1 AND sum(CASE WHEN p.fits THEN p.size + 1
        ELSE sync_internal.withheld_size(p.scope_name, p.table_name, p.ktext, p.body) END)
       OVER (PARTITION BY p.scope, p.origin ORDER BY p.seq) > p.budget
       WHEN p.grp > 0 THEN false END,
      p.position % rows_limit = 0, p.echo
      FROM (SELECT w.origin, w.scope, (r.position - 1) / rows_limit AS grp, w.head, w.scope_name,
       w.budget, r.seq, r.codec, r.key, r.table_name, r.ktext, r.body, r.hash, r.size,
       NOT r.withheld AND r.size + 1 <= w.budget AS fits, r.position, r.echo
       FROM (SELECT n.scope, n.sent AS origin, n.head, n.scope_name,
        bytes_limit - sync_internal.envelope_size('{*}', '{}')
        - sync_internal.chunk_size(n.scope_name, n.sent, n.head) - 1 AS budget,
        CASE WHEN n.sent > 0 THEN least(max(n.room), ahead) ELSE 1 END AS chunks
        FROM pg_temp.magic_sync_need n WHERE n.chunk IS NULL
        GROUP BY n.scope, n.sent, n.head, n.scope_name) w
       LEFT JOIN LATERAL (SELECT k.*, sync_internal.row_size(k.table_name, k.ktext, k.body) AS size
        FROM (SELECT x.seq, x.codec, x.key, c.table_name, sync_internal.canonical(x.key) AS ktext,
         x.body, encode(x.hash, 'hex') AS hash, x.withheld, x.position, x.echo
         FROM (SELECT y.*, row_number() OVER (ORDER BY y.seq) AS position
          FROM (SELECT seq, codec, key, body, hash, withheld, echo_of IS NOT NULL AS echo
           FROM sync.row
           WHERE scope = w.scope AND seq > w.origin AND seq <= w.head
           AND (w.origin > 0 OR NOT gone)
           AND (echo_of IS NULL OR w.origin < echo_prev OR EXISTS (SELECT FROM sync.member m
            WHERE m.scope = w.scope AND m.replica <> sync.row.echo_of))
           ORDER BY seq LIMIT rows_limit * w.chunks) y) x
         JOIN sync.codec c ON c.id = x.codec OFFSET 0) k) r ON true) p),
    runs AS (SELECT origin, scope, coalesce(grp, 0) AS grp, max(head) AS head,
     max(scope_name) AS scope_name, coalesce(bool_or(dropped), false) AS cut_by_bytes,
     bool_or(dropped) OR bool_or(last_fetched) AS cut_short,
     max(seq) FILTER (WHERE NOT dropped) AS last_seq,
     count(*) FILTER (WHERE fits AND NOT dropped) AS rows,
     coalesce(sum(size + 1) FILTER (WHERE fits AND NOT dropped), 0)
     + coalesce(sum(sync_internal.withheld_size(scope_name, table_name, ktext, body))
      FILTER (WHERE NOT fits AND NOT dropped), 0) AS row_bytes,
     coalesce(bool_or(echo), false) AS echoes,
     array_agg(seq) FILTER (WHERE fits AND NOT dropped) AS seqs,
     array_agg(table_name) FILTER (WHERE fits AND NOT dropped) AS tables,
     array_agg(ktext) FILTER (WHERE fits AND NOT dropped) AS keys,
     array_agg(body) FILTER (WHERE fits AND NOT dropped) AS bodies,
     array_agg(hash) FILTER (WHERE fits AND NOT dropped) AS hashes,
     jsonb_agg(sync_internal.withheld_note(scope_name, table_name, ktext, body)
      ORDER BY seq) FILTER (WHERE NOT fits AND NOT dropped) AS withheld,
     sum(sync_internal.withheld_size(scope_name, table_name, ktext, body))
      FILTER (WHERE NOT fits AND NOT dropped) AS withheld_bytes
     FROM picked GROUP BY origin, scope, coalesce(grp, 0)),
    started AS (SELECT r.*, CASE WHEN r.grp = 0 THEN r.origin ELSE
     lag(r.last_seq) OVER (PARTITION BY r.origin, r.scope ORDER BY r.grp) END AS from_seq
     FROM runs r),
    linked AS (SELECT s.*, bool_and(CASE WHEN s.grp = 0 THEN NOT s.cut_by_bytes
      ELSE NOT s.echoes AND s.row_bytes <= bytes_limit - sync_internal.envelope_size('{*}', '{}')
       - sync_internal.chunk_size(s.scope_name, s.from_seq, s.head) - 1 END)
     OVER (PARTITION BY s.origin, s.scope ORDER BY s.grp) AS chained FROM started s),
    built AS (INSERT INTO sync.chunk (scope, from_seq, to_seq, built_head, rows, bytes, body,
     withheld)
     SELECT l.scope, l.from_seq, t.to_seq, l.head, l.rows,
     octet_length(b.body) + coalesce(l.withheld_bytes, 0), b.body, coalesce(l.withheld, '[]')
     FROM linked l
     CROSS JOIN LATERAL (SELECT CASE WHEN l.cut_short THEN l.last_seq ELSE l.head END
      AS to_seq) t
     CROSS JOIN LATERAL (SELECT sync_internal.encode_chunk(l.scope_name, l.from_seq, t.to_seq,
      l.seqs, l.tables, l.keys, l.bodies, l.hashes) AS body OFFSET 0) b
     WHERE l.grp = 0 OR l.chained RETURNING scope, from_seq, to_seq)
    SELECT sync_internal.keep('row', array_agg(w.codec), array_agg(w.key), array_agg(w.reason))
    INTO withheld_rows
    FROM (SELECT DISTINCT ON (p.codec, p.key) p.codec, p.key,
    sync_internal.withheld_reason(p.scope_name, p.table_name, p.ktext, p.body) AS reason
    FROM picked p JOIN built b ON b.scope = p.scope AND p.seq > b.from_seq
     AND p.seq <= b.to_seq
    WHERE NOT p.fits AND NOT p.dropped ORDER BY p.codec, p.key, p.budget) w
    HAVING count(*) > 0;
    RETURN coalesce(withheld_rows, 0);
END
$$;

-- Packs each replica's next chunks into one message, within the row and byte limits. While a
-- sender is delivering to the replica (a lease holds), it gets a new message only when a chunk of
-- it is full (cut at a limit, more rows after it): a chunk that takes the rest of its scope waits
-- for that delivery to end (sync.sent wakes the relay), and takes what changed until then with
-- it. Otherwise, under a steady trickle of writes, every pass queued a small message behind the
-- one being delivered, and a change waited for a window of them to go, one at a time.
CREATE FUNCTION sync_internal.pass_pick_chunks(rows_limit int, bytes_limit int) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pg_temp.magic_sync_picked (replica, scope, chunk, chunk_to)
    SELECT replica, scope, chunk, chunk_to FROM (SELECT n.*,
     bool_or(n.chunk_to < n.head OR n.chunk_rows >= rows_limit)
      OVER (PARTITION BY n.replica) AS takes_full,
     row_number() OVER w AS position, sum(n.chunk_rows) OVER w AS rows_so_far,
     sum(n.chunk_bytes + 1) OVER w AS bytes_so_far,
     bytes_limit - sync_internal.envelope_size(CASE WHEN r.reset_pending THEN '{*}'::text[]
      ELSE '{}' END, r.pending_drops, r.pending_table_drops) AS budget,
     cardinality(r.pending_drops) + cardinality(r.pending_table_drops) > 0 AS drops
     FROM pg_temp.magic_sync_need n JOIN sync.replica r ON r.id = n.replica
     WINDOW w AS (PARTITION BY n.replica ORDER BY n.scope)) x
    WHERE (NOT in_flight OR takes_full) AND ((position = 1 AND NOT drops)
    OR (bytes_so_far <= budget AND (position = 1 OR rows_so_far <= rows_limit)));
END
$$;

-- Queues the round's messages (a replica's chunks picked, or a reset or drops alone for a replica
-- with room in its window) and advances the cursors. Drops go in the order they came, as many as
-- fit; the rest wait for the next message (which a message with chunks never precedes: those wait
-- until every drop fits). Returns the number of messages written.
CREATE FUNCTION sync_internal.pass_queue_messages(window_size int) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH message AS (
     SELECT replica, array_agg(chunk ORDER BY scope) AS chunks,
     jsonb_object_agg(scope::text, chunk_to) AS advances
     FROM pg_temp.magic_sync_picked GROUP BY replica
     UNION ALL SELECT r.id, '{}', '{}' FROM sync.replica r
     WHERE r.live AND (r.reset_pending OR cardinality(r.pending_drops) > 0
      OR cardinality(r.pending_table_drops) > 0)
     AND NOT EXISTS (SELECT FROM pg_temp.magic_sync_picked p WHERE p.replica = r.id)
     AND sync_internal.outbox_room(r.id, window_size) > 0),
    cut AS (SELECT m.*, r.reset_pending, r.pending_drops,
     r.pending_table_drops, sync_internal.drops_fitting(CASE WHEN r.reset_pending THEN '{*}'::text[]
      ELSE '{}' END, r.pending_drops, r.pending_table_drops) AS n,
     cardinality(r.pending_drops) AS scope_drops
     FROM message m JOIN sync.replica r ON r.id = m.replica),
    queued AS (INSERT INTO pg_temp.magic_sync_enqueue (replica, position, kind, chunks,
     reset, drops, table_drops, advances) SELECT c.replica, 1, 'rows', c.chunks,
     CASE WHEN c.reset_pending THEN '{*}'::text[] ELSE '{}' END, c.pending_drops[1:c.n],
     c.pending_table_drops[1:c.n - c.scope_drops], c.advances FROM cut c),
    -- Only the replicas whose message carried a reset or drops: the others' rows stay as they
    -- are (rewriting every replica that got a message was a new version of each, every round).
    counted AS (UPDATE sync.replica r SET reset_pending = false,
     pending_drops = c.pending_drops[c.n + 1:],
     pending_table_drops = c.pending_table_drops[greatest(c.n - c.scope_drops, 0) + 1:]
     FROM cut c WHERE r.id = c.replica AND (c.reset_pending OR cardinality(c.pending_drops) > 0
      OR cardinality(c.pending_table_drops) > 0))
    UPDATE sync.member m SET sent = p.chunk_to
    FROM pg_temp.magic_sync_picked p WHERE m.replica = p.replica AND m.scope = p.scope;
    RETURN sync_internal.enqueue();
END
$$;

-- The pass ends: the next passes read sync.row by scope and seq, and the replicas, their cursors
-- and their outboxes by replica, so their statistics are kept up with what the passes changed
-- (`analyze_rows`, `analyze_replicas`: the caller counts over passes). 100,000 rows planned
-- 10,000 a pass left sync.row "empty" to the planner, which then read every row after a cursor
-- to keep 200; 100,000 replicas provisioned 10,000 a pass left the outbox "empty", and the
-- planner matched every confirmation against every message, 25-38 s a pass. Senders are woken
-- when there are messages, and the pass's counts are kept for sync.relay_health.
CREATE FUNCTION sync_internal.pass_end(notes bigint, rows_changed bigint, provisioned bigint,
                              forgotten bigint, messages bigint, set_aside bigint,
                              analyze_rows boolean, analyze_replicas boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The senders are woken, and the pull gateway asks only about the devices of the replicas
    -- named: 200 ids a notification (PostgreSQL takes payloads under 8,000 bytes); past 1,000
    -- replicas, one notification that names none wakes every device.
    IF (SELECT count(*) FROM pg_temp.magic_sync_written) > 1000 THEN
        PERFORM pg_notify('magic_sync', '');
    ELSE
        PERFORM pg_notify('magic_sync', w.replicas)
        FROM (SELECT string_agg(replica::text, ',' ORDER BY replica) AS replicas
              FROM (SELECT replica, (row_number() OVER (ORDER BY replica) - 1) / 200 AS part
                    FROM pg_temp.magic_sync_written) n
              GROUP BY part) w;
    END IF;
    IF analyze_rows THEN
        ANALYZE sync.row;
    END IF;
    IF analyze_replicas THEN
        ANALYZE sync.replica, sync.member, sync.outbox;
    END IF;
    UPDATE sync.relay_state SET last_pass_at = clock_timestamp(), last_pass =
        jsonb_build_object('notes', notes, 'rows_changed', rows_changed,
                           'provisioned', provisioned, 'forgotten', forgotten,
                           'messages', messages, 'set_aside', set_aside);
END
$$;
