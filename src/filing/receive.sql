-- Filing uploads (docs/DESIGN.md §6) ------------------------------------------------------------------------
--
-- sync.receive() runs as its caller, so row-level security applies to what it files. What it
-- writes to sync tables goes through the helpers below, which it runs as the extension's owner
-- and which no other role may call; the receiver gets no grant on any sync table, so it cannot
-- read the outboxes. The helpers write only what the relay reads later (sync.upload, sync.answer,
-- sync.confirmation, sync.holding, sync.set_aside) and never update a row the relay pass locks.

-- Files an upload from `replica` (the one the route authenticated). Returns 'filed', 'answered
-- again' (an upload id filed before), 'kept' (a message that could not be decoded, set aside
-- whole), 'dropped' (a replica that known() does not know) or 'refused' (nothing of it filed or
-- kept: it would have kept more than its replica may, see sync_internal.kept_room; send it again
-- once there is room). An ERROR means nothing was filed:
-- send the same message again later (55000: it speaks a newer protocol than this server). The
-- message is an upload's JSON, or that JSON gzip-compressed (told by its first bytes).
-- Generic plans for the statements it runs (its own and its helpers'): with custom plans, each
-- call would plan them afresh, which costs more than filing a small upload.
CREATE FUNCTION sync.receive(replica uuid, message bytea) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_receive'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan;

-- The senders' hooks as qualified function names (NULL: the default), whether the replica is
-- live, which is what the default known() asks, and its row of the replicas relation (what a
-- both row's audience is worked out against) with that relation's quoted name; and the history
-- the relay writes in (an upload said in another one is not taken for what it says of the replica).
CREATE FUNCTION sync_internal.receive_setup(replica uuid, OUT known text, OUT filing text, OUT live boolean,
                                   OUT replica_row jsonb, OUT replicas text, OUT change bigint,
                                   OUT origin text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    relation regclass;
BEGIN
    PERFORM sync_internal.relay_guard();  -- first: the lock order DROP EXTENSION keeps
    change := sync_internal.filing_change_committed();
    origin := sync_internal.origin();
    relation := (SELECT s.relation FROM sync.replica_set s);
    IF relation IS NOT NULL THEN
        replicas := relation::text;
        EXECUTE format('SELECT to_jsonb(r.*) FROM %s r WHERE r.id = $1', relation)
        INTO replica_row USING receive_setup.replica;
    END IF;
    SELECT (SELECT format('%I.%I', n.nspname, p.proname) FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = s.known),
           (SELECT format('%I.%I', n.nspname, p.proname) FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = s.filing),
           EXISTS (SELECT FROM sync.replica r WHERE r.id = receive_setup.replica AND r.live)
    INTO known, filing, live
    FROM (VALUES (1)) AS one(x) LEFT JOIN sync.sender_rule s ON true;
END
$$;

-- Of `tables` (names as on the wire), those that are no codec's but a user table's (not yet
-- declared): that table's primary key columns, in order (a declared table's columns:
-- sync_internal.codec_columns). A row kept for such a table is named by its key, so the device can tell
-- its rows apart and the retry, once the table is declared, answers which of them it filed.
CREATE FUNCTION sync_internal.receive_undeclared(tables text[])
RETURNS TABLE (table_name text, column_name text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    undeclared text;
    user_table regclass;
BEGIN
    FOR undeclared IN
        SELECT DISTINCT u FROM unnest(tables) u
        WHERE NOT EXISTS (SELECT FROM sync.codec c WHERE c.table_name = u)
    LOOP
        BEGIN
            user_table := to_regclass(undeclared);
        EXCEPTION WHEN OTHERS THEN  -- not a name at all ("a.b.c.d", "x; DROP ...")
            user_table := NULL;
        END;
        CONTINUE WHEN user_table IS NULL OR sync_internal.relation_name(user_table) <> undeclared;
        RETURN QUERY
        SELECT undeclared, k.attname::text
        FROM pg_class t
        JOIN pg_namespace n ON n.oid = t.relnamespace
        CROSS JOIN LATERAL unnest(sync_internal.key_columns(t.oid)) WITH ORDINALITY AS k(attname, ord)
        WHERE t.oid = user_table AND t.relkind IN ('r', 'p')
          AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'sync')
        ORDER BY k.ord;
    END LOOP;
END
$$;

-- Records that `replica` sent upload `upload`, first: a second receive of the same id waits here
-- until the first commits, and then finds it. Returns NULL for a new upload, else the kept list
-- it was answered with.
CREATE FUNCTION sync_internal.upload_begin(replica uuid, upload uuid) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO sync.upload (replica, id) VALUES (upload_begin.replica, upload_begin.upload)
    ON CONFLICT (replica, id) DO NOTHING;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    -- A new statement: it sees the row the first receive committed.
    RETURN (SELECT u.kept FROM sync.upload u
            WHERE u.replica = upload_begin.replica AND u.id = upload_begin.upload);
END
$$;

-- The role an upload is kept for, to be filed again as (sync.set_aside.filed_as): the role that
-- receive ran as, if the session's login may become it, else the login itself. A caller that
-- names a role of its own choosing gets no role it could not take anyway.
CREATE FUNCTION sync_internal.filer(filed_as name) RETURNS name
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN filed_as IS NULL OR to_regrole(filed_as) IS NULL THEN session_user
                WHEN pg_has_role(session_user, filed_as, 'MEMBER') THEN filed_as
                ELSE session_user END
$$;

-- After the rows: sets aside the kept rows that carry a body, remembers and answers the kept list
-- (t, k, why), and takes what the upload says of the replica: `applied` (confirmed by the next
-- pass), `untaken` (set aside, per replica and row) and `holds` (kept for verification).
-- `filed_as`: the role receive ran as (see sync_internal.filer). The answer remembered is the last one: a
-- message kept whole and filed by the retry is answered with what was filed of it.
CREATE FUNCTION sync_internal.upload_end(replica uuid, upload uuid, kept jsonb, applied bigint,
                                untaken jsonb, holds jsonb, answered boolean,
                                filed_as name DEFAULT NULL, change_seen bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    answer jsonb := CASE WHEN kept = '[]' THEN kept ELSE
                        (SELECT jsonb_agg(jsonb_build_object('t', e->'t', 'k', e->'k', 'why', e->'why')
                                          ORDER BY i)
                         FROM jsonb_array_elements(kept) WITH ORDINALITY AS x(e, i)) END;
    last_sent bigint;
BEGIN
    IF kept <> '[]' THEN
        PERFORM sync_internal.keep_upload(upload_end.replica, upload_end.upload,
                                 sync_internal.filer(upload_end.filed_as), kept,
                                 change_seen => upload_end.change_seen);
    END IF;
    UPDATE sync.upload u SET kept = answer
    WHERE u.replica = upload_end.replica AND u.id = upload_end.upload AND u.kept <> answer;
    -- An upload that carried no rows (only applied, untaken, holds) is not answered: the answer
    -- would be one more message for the replica to confirm, and nothing to tell it.
    IF answered THEN
        INSERT INTO sync.answer (replica, kind, payload)
        VALUES (upload_end.replica, 'filed', sync_internal.filed_payload(upload_end.upload, answer));
    END IF;

    SELECT r.next_seq - 1 INTO last_sent FROM sync.replica r WHERE r.id = upload_end.replica;
    IF applied > 0 THEN
        IF applied > coalesce(last_sent, 0) THEN
            RAISE LOG 'magic_sync: replica % says it applied message %, but it has been sent messages only up to %: ignored',
                      upload_end.replica, applied, coalesce(last_sent, 0);
        ELSE
            INSERT INTO sync.confirmation (replica, applied) VALUES (upload_end.replica, applied);
        END IF;
    END IF;

    IF untaken <> '[]' THEN
        PERFORM sync_internal.keep_untaken(upload_end.replica, untaken);
    END IF;

    IF holds <> '{}' THEN
        INSERT INTO sync.holding AS h (replica, scope, through, fp, n, ranges, reported_at, applied,
                                       settled)
        SELECT upload_end.replica, e.key, report.through, report.fp, report.n, e.value->'ranges',
               now(), least(coalesce(upload_end.applied, 0), coalesce(last_sent, 0)),
               sync_internal.report_settled(report.through, report.fp, report.n, mine.scope)
        FROM jsonb_each(holds) e
        CROSS JOIN LATERAL (SELECT (e.value->>'through')::bigint AS through,
                                   decode(e.value->>'fp', 'hex') AS fp, (e.value->>'n')::bigint AS n) report
        -- Only the scopes it belongs to: an upload names what it likes.
        JOIN (SELECT sync_internal.scope_name(s.match, s.value, s.partition) AS name, s AS scope
              FROM sync.member m JOIN sync.scope s ON s.id = m.scope
              WHERE m.replica = upload_end.replica) mine ON mine.name = e.key
        ON CONFLICT (replica, scope) DO UPDATE
            SET through = excluded.through, fp = excluded.fp, n = excluded.n,
                ranges = excluded.ranges, reported_at = excluded.reported_at,
                applied = excluded.applied, settled = excluded.settled
            WHERE h.applied <= excluded.applied;
        INSERT INTO sync.foreign_holding (replica, scope)
        SELECT upload_end.replica, e.key FROM jsonb_each(holds) e
        WHERE NOT EXISTS (SELECT FROM sync.member m JOIN sync.scope s ON s.id = m.scope
                          WHERE m.replica = upload_end.replica
                            AND sync_internal.scope_name(s.match, s.value, s.partition) = e.key)
        ON CONFLICT DO NOTHING;
    END IF;

    -- The device is there: a backoff its deliveries wait out ends now.
    PERFORM sync_internal.device_heard(upload_end.replica);
END
$$;

-- Whether an answer of the upload waits for the replica: not moved to its outbox yet, or there
-- and not confirmed. An upload sent again meanwhile is answered by that one (a device whose
-- answers are slow to come, sending it again and again, got a message more each time).
CREATE FUNCTION sync_internal.answer_waits(replica uuid, upload uuid) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT FROM sync.answer a WHERE a.replica = answer_waits.replica
                   AND a.payload->>'upload' = answer_waits.upload::text)
        OR EXISTS (SELECT FROM sync.outbox o WHERE o.replica = answer_waits.replica
                   AND o.upload = answer_waits.upload)
$$;

-- A message that could not be decoded, kept as it came, under its id when that could be read.
-- `filed_as`: as for upload_end. `waits`: as for sync_internal.keep_upload (a message over the size limit
-- does not wait: it is filed once the limit is raised).
CREATE FUNCTION sync_internal.keep_message(replica uuid, message bytea, reason text, filed_as name DEFAULT NULL,
                                  upload uuid DEFAULT NULL, waits boolean DEFAULT true)
RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sync_internal.keep_upload(keep_message.replica, keep_message.upload,
                            sync_internal.filer(keep_message.filed_as), NULL, keep_message.message,
                            keep_message.reason, keep_message.waits)
$$;

-- The `both` rows of an upload that were filed, as uploaded: [{"t", "k", "r"}] (see sync.echo).
CREATE FUNCTION sync_internal.upload_echoes(replica uuid, upload uuid, echoes jsonb) RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO sync.echo (replica, upload, codec, key, body)
    SELECT upload_echoes.replica, upload_echoes.upload, c.id, e->'k', e->'r'
    FROM jsonb_array_elements(echoes) e JOIN sync.codec c ON c.table_name = e->>'t'
$$;

-- The receiver calls sync.receive; nothing else. sync.receive runs the helpers as the extension's
-- owner (pg::as_extension_owner), so no caller can run them past known() or for another replica.
REVOKE ALL ON FUNCTION sync.receive(uuid, bytea), sync_internal.encode_filed(uuid, bigint, bigint, jsonb),
    sync_internal.filed_parts(uuid, jsonb, bigint),
    sync_internal.receive_setup(uuid), sync_internal.receive_undeclared(text[]), sync_internal.upload_begin(uuid, uuid),
    sync_internal.answer_waits(uuid, uuid),
    sync_internal.upload_end(uuid, uuid, jsonb, bigint, jsonb, jsonb, boolean, name, bigint),
    sync_internal.keep_message(uuid, bytea, text, name, uuid, boolean), sync_internal.filer(name),
    sync_internal.upload_echoes(uuid, uuid, jsonb)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sync.receive(uuid, bytea) TO sync_receiver;
