-- What could not be planned, sent or filed (docs/DESIGN.md §3, §6, §13): sync.set_aside and its one owner.
-- Everything that keeps an item, counts it again, tries it again or releases it is here; the pass,
-- sync.receive's helpers and the relay loop call these functions and never write the table.
--
-- Kinds: `note`, a change the pass could not plan; `row`, a row it could not send (too big);
-- `untaken`, a row a replica could not take; `upload`, a row of an upload, or a whole message,
-- that sync.receive could not file.

-- What filing depends on besides the rows themselves, as a counter: it moves on every DDL command
-- (a deploy, a declaration, a grant, a policy), every change of the declarations or the senders'
-- hooks, and whenever the relay takes its lock (a new build). A kept upload that no data can cure
-- waits for it to move. Each change is logged with its number in its own transaction, and the
-- retry goes by the last one committed: a change still in flight (a declaration not committed
-- yet) is seen once it commits, not before (the retry would try the upload without it, and never
-- again).
CREATE SEQUENCE sync.filing_change;
-- Dumped with the kept uploads, whose change_seen counts on it.
SELECT pg_catalog.pg_extension_config_dump('sync.filing_change', '');
CREATE TABLE sync.filing_change_log (n bigint PRIMARY KEY);

-- pg_restore sets the sequence (it is dumped) back to its dumped value after the DDL of the
-- restore's first section moved it on and logged those numbers: a number already logged is not
-- taken again, the sequence goes on past the log.
CREATE FUNCTION sync_internal.filing_changed() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    change bigint := nextval('sync.filing_change');
    logged bigint := (SELECT max(l.n) FROM sync.filing_change_log l);
BEGIN
    IF change <= logged THEN
        change := setval('sync.filing_change', logged + 1);
    END IF;
    INSERT INTO sync.filing_change_log VALUES (change) ON CONFLICT DO NOTHING;
    -- The relay tries again what waited for it as soon as this commits.
    PERFORM sync_internal.wake();
    RETURN change;
END
$$;

-- The last change committed.
CREATE FUNCTION sync_internal.filing_change_committed() RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN (SELECT coalesce(max(n), 0) FROM sync.filing_change_log); END $$;

-- Temporary tables (the relay plans in some) change nothing filing depends on.
CREATE FUNCTION sync_internal.note_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_event_trigger_ddl_commands())
       OR EXISTS (SELECT FROM pg_event_trigger_ddl_commands() c
                  WHERE coalesce(c.schema_name, '') NOT LIKE 'pg\_temp%') THEN
        PERFORM sync_internal.filing_changed();
    END IF;
END
$$;
CREATE EVENT TRIGGER magic_sync_filing_change ON ddl_command_end
EXECUTE FUNCTION sync_internal.note_ddl();

CREATE FUNCTION sync_internal.note_declaration() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sync_internal.filing_changed();
    RETURN NULL;
END
$$;
CREATE TRIGGER filing_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sync.codec
FOR EACH STATEMENT EXECUTE FUNCTION sync_internal.note_declaration();
CREATE TRIGGER filing_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sync.sender_rule
FOR EACH STATEMENT EXECUTE FUNCTION sync_internal.note_declaration();

-- The settings a value's text is read under when filing converts it to its column's type: dates
-- and times, intervals, money, xml, arrays. Kept with what receive keeps, as the route had them,
-- and set again when the retry files it.
CREATE FUNCTION sync_internal.filing_settings() RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT jsonb_object_agg(name, current_setting(name))
        FROM unnest(ARRAY['DateStyle', 'IntervalStyle', 'TimeZone', 'lc_monetary', 'xmloption',
                          'array_nulls']) AS name);

-- How long a kept upload whose failure the data may cure waits after its `tries`-th try: no
-- time after the first (the next retry), then 1, 3, 7, ... up to 63 times magic_sync.retry_every;
-- sooner when a table its table references is written (sync_internal.kept_uploads_due).
CREATE FUNCTION sync_internal.backoff(tries int) RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN sync.setting('retry_every')::interval * (2 ^ least(tries - 1, 6) - 1);

-- Keeping ---------------------------------------------------------------------------------------

-- Keeps notes or rows (`kind` 'note' or 'row') the pass could not plan or send, with their
-- reasons; one kept already is counted again, its reason the latest. Returns how many.
CREATE FUNCTION sync_internal.keep(kind text, codecs int[], keys jsonb[], reasons text[]) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH kept AS (
        INSERT INTO sync.set_aside AS s (kind, codec, key, reason)
        SELECT DISTINCT ON (i.codec, i.key) keep.kind, i.codec, i.key, i.reason
        FROM unnest(codecs, keys, reasons) WITH ORDINALITY AS i(codec, key, reason, n)
        ORDER BY i.codec, i.key, i.n DESC
        ON CONFLICT (kind, codec, key) WHERE kind IN ('note', 'row') DO UPDATE
            SET tries = s.tries + 1, last_try_at = now(), reason = excluded.reason
        RETURNING 1)
    SELECT count(*) FROM kept
$$;

-- Keeps the rows `replica` reported it could not take ([{"seq", "t", "k", "why"}]), the latest
-- report of a row counted again.
CREATE FUNCTION sync_internal.keep_untaken(replica uuid, untaken jsonb) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO sync.set_aside AS s (kind, replica, codec, key, body, reason)
    SELECT DISTINCT ON (c.id, e->'k') 'untaken', keep_untaken.replica, c.id, e->'k',
           convert_to(e::text, 'UTF8'), format('message %s: %s', e->>'seq', e->>'why')
    FROM jsonb_array_elements(untaken) e
    LEFT JOIN sync.codec c ON c.table_name = e->>'t'
    ORDER BY c.id, e->'k', (e->>'seq')::bigint DESC
    ON CONFLICT (replica, codec, key) WHERE kind = 'untaken' DO UPDATE
        SET tries = s.tries + 1, last_try_at = now(), body = excluded.body,
            reason = excluded.reason
        -- Not from an older message (an upload sent again as it was stored).
        WHERE (convert_from(s.body, 'UTF8')::jsonb->>'seq')::bigint
              <= (convert_from(excluded.body, 'UTF8')::jsonb->>'seq')::bigint
$$;

-- Keeps what sync.receive could not file of upload `upload` from `replica`, to be filed again as
-- `filed_as` under the session's filing settings: the rows of `kept` that carry a body
-- ([{"t", "k", "reason", "body", "waits"}]), or (`kept` NULL) `message` whole. `waits`: only a
-- change of what filing depends on can cure it; otherwise it is tried again, backed off.
-- `change_seen`: the last change committed before filing read the declarations (NULL: now), so
-- that a change that committed while the upload was being filed makes it tried again.
CREATE FUNCTION sync_internal.keep_upload(replica uuid, upload uuid, filed_as name, kept jsonb,
                                 message bytea DEFAULT NULL, reason text DEFAULT NULL,
                                 waits boolean DEFAULT true, change_seen bigint DEFAULT NULL)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO sync.set_aside (kind, replica, upload, table_name, codec, key, body, reason,
                                filed_as, settings, next_try_at, change_seen, data_seen)
    SELECT 'upload', keep_upload.replica, keep_upload.upload, e->>'t', c.id, e->'k',
           coalesce(keep_upload.message, convert_to(e->>'body', 'UTF8')),
           coalesce(e->>'reason', keep_upload.reason),
           keep_upload.filed_as, sync_internal.filing_settings(),
           CASE WHEN coalesce((e->'waits')::boolean, keep_upload.waits) THEN NULL ELSE now() END,
           coalesce(keep_upload.change_seen, sync_internal.filing_change_committed()),
           sync_internal.writes_referenced(c.relation)
    FROM (SELECT e, i FROM jsonb_array_elements(keep_upload.kept) WITH ORDINALITY AS x(e, i)
          WHERE e ? 'body'
          UNION ALL SELECT NULL, 1 WHERE keep_upload.kept IS NULL) AS x
    LEFT JOIN sync.codec c ON c.table_name = e->>'t'
    ORDER BY x.i
$$;

-- Why `replica` may not keep `items` more rows or messages of `bytes` bytes from its uploads,
-- when what it keeps already would then be over `max_items` or `max_bytes`
-- (magic_sync.max_kept_items, magic_sync.max_kept_bytes); NULL when it may. One device must not
-- fill the database's disk with what cannot be filed.
CREATE FUNCTION sync_internal.kept_room(replica uuid, items bigint, bytes bigint, max_items bigint,
                                        max_bytes bigint) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('replica %s keeps %s rows and messages of %s from its uploads (sync.set_aside); '
                  'this upload would keep %s more of %s, past magic_sync.max_kept_items = %s or '
                  'magic_sync.max_kept_bytes = %s', kept_room.replica, k.items,
                  pg_size_pretty(k.bytes), kept_room.items, pg_size_pretty(kept_room.bytes),
                  max_items, pg_size_pretty(max_bytes))
    FROM (SELECT count(*) AS items, coalesce(sum(octet_length(s.body)), 0) AS bytes
          FROM sync.set_aside s
          WHERE s.kind = 'upload' AND s.replica = kept_room.replica) k
    WHERE k.items + kept_room.items > max_items OR k.bytes + kept_room.bytes > max_bytes
$$;

-- An upload of `replica` refused (`why`): counted, for the operator.
CREATE FUNCTION sync_internal.upload_refused(replica uuid, why text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO sync.upload_refusal AS f (replica, why) VALUES (upload_refused.replica, upload_refused.why)
    ON CONFLICT (replica) DO UPDATE SET refused = f.refused + 1, last_at = now(), why = excluded.why
$$;

-- The writes PostgreSQL's statistics count to the tables `relation` references by foreign key
-- (not itself), their partitions included, and this transaction's own not reported yet: a failed
-- filing's insert counts too (an aborted row is counted inserted), and is in the figure its item
-- is kept with, so that it does not wake the item again. NULL: it references none.
CREATE FUNCTION sync_internal.writes_referenced(relation regclass) RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
RETURN (SELECT sum(pg_stat_get_tuples_inserted(t.relid) + pg_stat_get_tuples_updated(t.relid)
                   + pg_stat_get_xact_tuples_inserted(t.relid) + pg_stat_get_xact_tuples_updated(t.relid))
        FROM (SELECT f.confrelid AS relid FROM pg_constraint f
              WHERE f.conrelid = relation AND f.contype = 'f' AND f.confrelid <> f.conrelid
              UNION
              SELECT p.relid FROM pg_constraint f CROSS JOIN LATERAL pg_partition_tree(f.confrelid) p
              WHERE f.conrelid = relation AND f.contype = 'f' AND f.confrelid <> f.conrelid) t);

-- Whether kept uploads are due now, for the relay, which starts a retry when they are. First, a
-- kept upload that data may cure (a row its foreign key references has not come) is made due as
-- soon as the tables its table references were written since its last try: within seconds
-- (statistics reach other sessions within a second of a commit, or ten for a session left idle
-- in a transaction), not after its backoff. At most every 2^(tries - 1) seconds up to 10: two
-- tables that reference each other would otherwise wake each other's kept rows at every try.
CREATE FUNCTION sync_internal.kept_uploads_due() RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The writes counted once per declared table, not once per kept item.
    WITH referenced AS MATERIALIZED (
        SELECT c.table_name, sync_internal.writes_referenced(c.relation) AS writes FROM sync.codec c)
    UPDATE sync.set_aside s SET next_try_at = now()
    FROM referenced c
    WHERE s.kind = 'upload' AND s.next_try_at > now() AND c.table_name = s.table_name
      AND s.last_try_at <= now() - interval '1 second' * least(2 ^ least(s.tries - 1, 4), 10)
      AND s.data_seen IS DISTINCT FROM c.writes;
    RETURN EXISTS (SELECT FROM sync.set_aside s WHERE s.kind = 'upload' AND s.next_try_at <= now())
           OR EXISTS (SELECT FROM sync.set_aside s WHERE s.kind = 'upload'
                      AND s.change_seen < sync_internal.filing_change_committed());
END
$$;

-- Releasing -------------------------------------------------------------------------------------

-- Releases what the pass planned now: its notes, and its rows set aside (planned again, a row
-- is sent as its new version, or withheld again).
CREATE FUNCTION sync_internal.release_planned(codecs int[], keys jsonb[]) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM sync.set_aside s USING unnest(codecs, keys) AS i(codec, key)
    WHERE s.kind IN ('note', 'row') AND s.codec = i.codec AND s.key = i.key
$$;

-- Releases what the relay set aside of codecs that ended (sync.drop(), a dropped table): their
-- notes, rows and untaken rows. Kept uploads stay: a table declared again files them.
CREATE FUNCTION sync_internal.release_codecs(codecs int[]) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM sync.set_aside s
    WHERE s.codec = ANY (codecs) AND s.kind IN ('note', 'row', 'untaken')
$$;

-- Trying again ----------------------------------------------------------------------------------

-- Files the kept uploads `ids` again (src/filing/receive.cpp): [{"id", "filed", "answered", "key",
-- "reason", "waits"}], one per item.
CREATE FUNCTION sync_internal.refile(ids bigint[]) RETURNS jsonb
AS 'MODULE_PATHNAME', 'magic_sync_refile'
LANGUAGE C VOLATILE STRICT
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan;

-- What the relay could not plan or send, tried again: notes are planned again; rows withheld as
-- too big, or that a replica could not take, are sent again (a new seq in their scope, their
-- content unchanged), so a deploy that fixed the cause lets them through. Run on the relay's
-- retry_every timer and when it takes the lock. Returns what it did, as log lines.
CREATE FUNCTION sync_internal.retry_notes_and_rows() RETURNS TABLE (level text, line text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    notes bigint;
    rows_again bigint;
BEGIN
    PERFORM sync_internal.relay_lock();
    INSERT INTO sync.note (codec, key) SELECT s.codec, s.key FROM sync.set_aside s WHERE s.kind = 'note';
    GET DIAGNOSTICS notes = ROW_COUNT;
    WITH again AS (
        DELETE FROM sync.set_aside s WHERE s.kind IN ('row', 'untaken') RETURNING s.codec, s.key),
    bumped AS (
        UPDATE sync.row r SET seq = nextval('sync.row_seq')
        FROM (SELECT DISTINCT sync_internal.key_hash(c.table_name, a.key) AS k
              FROM again a JOIN sync.codec c ON c.id = a.codec) a
        WHERE r.k = a.k AND NOT r.gone
        RETURNING r.scope, r.seq)
    UPDATE sync.scope s SET head = greatest(s.head, b.seq)
    FROM (SELECT scope, max(seq) AS seq FROM bumped GROUP BY scope) b
    WHERE s.id = b.scope;
    GET DIAGNOSTICS rows_again = ROW_COUNT;
    IF notes + rows_again > 0 THEN
        level := 'LOG';
        line := format('retrying what was set aside: %s notes planned again, rows sent again in %s scopes',
                       notes, rows_again);
        RETURN NEXT;
    END IF;
END
$$;

-- One slice of the kept uploads that are due, filed again in the caller's transaction: chunks of
-- at most 100 items (fewer when their bodies pass 64 MB) until `slice` items are done or `budget`
-- has gone, so that a slice is short whatever each item costs. Each item is filed as its route
-- filed it (as its role, under its settings, after the senders' hooks). Due: an item whose
-- failure the data may cure, once its backoff has passed; any item, once sync.filing_change has
-- moved since it was last tried. What is filed is released and its upload answered again, under
-- its own id, once none of its items is due (the answer names what is still kept of it); what is
-- kept again has its reason, its tries counted and its next try. `more`: items are still due.
--
-- The relay runs it in a transaction of its own per slice, passes between; by hand,
-- sync.retry_set_aside() runs every slice.
CREATE FUNCTION sync.retry_uploads(slice int DEFAULT 1000, budget interval DEFAULT '100 ms',
                                   OUT filed bigint, OUT kept bigint, OUT more boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    change bigint := sync_internal.filing_change_committed();
    started timestamptz := clock_timestamp();
    chunk int;
    due bigint[];
    chunk_filed bigint;
    chunk_kept bigint;
BEGIN
    PERFORM sync_internal.relay_lock();
    DELETE FROM sync.filing_change_log l WHERE l.n < change;
    filed := 0;
    kept := 0;
    LOOP
        chunk := least(100, slice - filed - kept);
        -- Each candidate found through its index, whatever the table's statistics say: a chunk
        -- costs the same with 2,000 items kept as with 100,000. What this slice did is no longer
        -- due, so the next chunk finds the next items.
        SELECT array_agg(d.id ORDER BY d.id) INTO due FROM (
            SELECT l.id, sum(l.bytes) OVER (ORDER BY l.id) - l.bytes AS before
            FROM (SELECT s.id, octet_length(s.body) AS bytes
                  FROM ((SELECT a.id FROM sync.set_aside a
                         WHERE a.kind = 'upload' AND a.next_try_at <= now()
                         ORDER BY a.next_try_at LIMIT chunk)
                        UNION
                        (SELECT a.id FROM sync.set_aside a
                         WHERE a.kind = 'upload' AND a.change_seen < change
                         ORDER BY a.change_seen LIMIT chunk)) c
                  JOIN sync.set_aside s ON s.id = c.id
                  ORDER BY s.id LIMIT chunk FOR UPDATE OF s SKIP LOCKED) l) d
        WHERE d.before < 64 * 1024 * 1024;
        EXIT WHEN due IS NULL;

        WITH outcome AS MATERIALIZED (
            SELECT o.* FROM jsonb_to_recordset(sync_internal.refile(due))
                AS o(id bigint, filed boolean, answered boolean, key jsonb, reason text, waits boolean)),
        released AS (
            DELETE FROM sync.set_aside s USING outcome o
            WHERE s.id = o.id AND o.filed
            RETURNING s.replica, s.upload, o.answered),
        refiled AS (
            UPDATE sync.upload u SET refiled = true
            FROM (SELECT DISTINCT r.replica, r.upload FROM released r WHERE NOT r.answered) r
            WHERE u.replica = r.replica AND u.id = r.upload),
        counted AS (
            UPDATE sync.set_aside s
            SET reason = o.reason, key = coalesce(o.key, s.key),
                codec = (SELECT c.id FROM sync.codec c WHERE c.table_name = s.table_name),
                tries = s.tries + 1, last_try_at = now(), change_seen = change,
                next_try_at = CASE WHEN o.waits THEN NULL ELSE now() + sync_internal.backoff(s.tries + 1) END,
                data_seen = sync_internal.writes_referenced(
                    (SELECT c.relation FROM sync.codec c WHERE c.table_name = s.table_name))
            FROM outcome o
            WHERE s.id = o.id AND NOT o.filed)
        SELECT count(*) FILTER (WHERE o.filed), count(*) FILTER (WHERE NOT o.filed)
        INTO chunk_filed, chunk_kept FROM outcome o;
        filed := filed + chunk_filed;
        kept := kept + chunk_kept;
        EXIT WHEN filed + kept >= slice OR clock_timestamp() - started >= budget;
    END LOOP;

    -- Uploads whose kept rows the retry filed, and none of whose rows is due any more: answered
    -- again under their own ids, with what is still kept of them.
    WITH answered AS (
        UPDATE sync.upload u SET refiled = false,
            kept = coalesce((SELECT jsonb_agg(jsonb_build_object('t', s.table_name, 'k', s.key,
                                                                 'why', s.reason) ORDER BY s.id)
                             FROM sync.set_aside s
                             WHERE s.kind = 'upload' AND s.replica = u.replica
                               AND s.upload = u.id), '[]')
        WHERE u.refiled AND NOT EXISTS (
            SELECT FROM sync.set_aside s
            WHERE s.kind = 'upload' AND s.replica = u.replica AND s.upload = u.id
              AND (s.next_try_at <= now() OR s.change_seen < change))
        RETURNING u.replica, u.id, u.kept)
    INSERT INTO sync.answer (replica, kind, payload)
    SELECT a.replica, 'filed', sync_internal.filed_payload(a.id, a.kept) FROM answered a;
    IF FOUND THEN
        PERFORM sync_internal.wake();  -- the relay moves the answers as soon as this commits
    END IF;

    more := coalesce((SELECT min(s.next_try_at) FROM sync.set_aside s WHERE s.kind = 'upload')
                     <= now(), false)
            OR coalesce((SELECT min(s.change_seen) FROM sync.set_aside s WHERE s.kind = 'upload')
                        < change, false);
END
$$;

-- Everything that is due, tried again in this transaction: what the relay could not plan or
-- send, and every slice of the kept uploads. Returns what it did, as log lines. While a relay
-- runs (the worker holds the relay lock), the relay is asked instead: it tries everything again,
-- every kept upload included, as soon as this commits, and says what came of it in its log.
CREATE FUNCTION sync.retry_set_aside() RETURNS TABLE (level text, line text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    relay int := sync_internal.relay_lock_holder();
    slice record;
    filed bigint := 0;
    kept bigint := 0;
BEGIN
    IF relay IS NOT NULL AND relay <> pg_backend_pid() THEN
        PERFORM sync_internal.filing_changed();
        level := 'LOG';
        line := format('the relay (pid %s) tries again what was set aside and every kept upload as '
                       'soon as this commits; its log says what came of it', relay);
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM sync_internal.retry_notes_and_rows();
    LOOP
        slice := sync.retry_uploads();
        filed := filed + slice.filed;
        kept := kept + slice.kept;
        EXIT WHEN NOT slice.more OR slice.filed + slice.kept = 0;
    END LOOP;
    IF filed + kept > 0 THEN
        level := 'LOG';
        line := format('retrying kept uploads: %s filed now, %s kept again', filed, kept);
        RETURN NEXT;
    END IF;
END
$$;
