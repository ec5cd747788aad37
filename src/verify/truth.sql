-- Truth, not bookkeeping (docs/DESIGN.md §13) -------------------------------------------------------------
--
-- What a replica must hold, worked out from the declarations (sync.codec, sync.replica_set) and
-- the user tables alone, by the declared rules: never from the relay's state (sync.row,
-- sync.scope, sync.member, sync.chunk, the outbox). It encodes rows with to_json and hashes them
-- with PostgreSQL's sha256, apart from the pass's own encoder and hashes, so that the two can be
-- held against each other: sync.expected() for one replica, sync.audit() for every scope. Values
-- are written under the settings sync.pass pins (TimeZone, IntervalStyle, ...).

-- Whether the value `expr` of type `type` cannot travel exactly, as SQL (a boolean expression, NULL
-- when no value of the type is such): a jsonb holding JSON null, an array whose lower bound is
-- not 1, at any depth of arrays and composites. The pass's encoder marks such values as it walks
-- them (src/pg/jsonb_canonical.cpp, NotExact); this is the same rule in SQL, apart from it, for
-- the truth functions.
CREATE FUNCTION sync_internal.not_exact_sql(expr text, type oid, depth int DEFAULT 1) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t pg_type;
    element text;
    parts text[];
BEGIN
    SELECT * INTO t FROM pg_type x WHERE x.oid = type;
    WHILE t.typtype = 'd' LOOP
        SELECT * INTO t FROM pg_type x WHERE x.oid = t.typbasetype;
    END LOOP;
    IF t.oid = 'jsonb'::regtype THEN
        RETURN format('%s = ''null''::jsonb', expr);
    ELSIF t.typcategory = 'A' AND t.typelem <> 0 AND depth < 10 THEN
        element := sync_internal.not_exact_sql('e' || depth, t.typelem, depth + 1);
        RETURN format('(array_dims(%s) !~ ''^(\[1:[0-9]+\])*$''%s)', expr,
                      CASE WHEN element IS NOT NULL
                           THEN format(' OR EXISTS (SELECT FROM unnest(%s) e%s WHERE %s)',
                                       expr, depth, element) ELSE '' END);
    ELSIF t.typtype = 'c' AND depth < 10 THEN
        SELECT array_agg(x.part ORDER BY x.attnum) INTO parts
        FROM (SELECT a.attnum, sync_internal.not_exact_sql(format('(%s).%I', expr, a.attname),
                                                            a.atttypid, depth + 1) AS part
              FROM pg_attribute a
              WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) x
        WHERE x.part IS NOT NULL;
        RETURN '(' || array_to_string(parts, ' OR ') || ')';
    END IF;
    RETURN NULL;
END
$$;

-- The rows a codec's declaration puts in scopes, read from its table aliased t, as SQL: table_name,
-- key and body (canonical JSON), and the scope each row lives in (match, value, part; value NULL:
-- in none). With `for_replica`, only the rows of the audience of the live replica $1.
CREATE FUNCTION sync_internal.declared_rows_sql(codec int, for_replica boolean) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c sync.codec;
    r sync.replica_set;
    key_object text;
    hidden name[];
    not_exact text;
BEGIN
    SELECT * INTO c FROM sync.codec x WHERE x.id = declared_rows_sql.codec;
    SELECT * INTO r FROM sync.replica_set;
    SELECT string_agg(format('%L, t.%I', k, k), ', ' ORDER BY position) INTO key_object
    FROM unnest(c.key_columns) WITH ORDINALITY AS x(k, position);
    SELECT coalesce(array_agg(a.attname ORDER BY a.attnum), '{}') INTO hidden
    FROM pg_attribute a
    WHERE a.attrelid = c.relation AND a.attnum > 0 AND NOT a.attisdropped
      AND c.columns IS NOT NULL AND a.attname <> ALL (c.columns);
    -- A row with a value that cannot travel exactly is withheld (protocol::not_exact_reason): its
    -- body is only the marker.
    SELECT string_agg(x.test, ' OR ' ORDER BY x.attnum) INTO not_exact
    FROM (SELECT a.attnum, sync_internal.not_exact_sql(format('t.%I', a.attname), a.atttypid) AS test
          FROM pg_attribute a
          WHERE a.attrelid = c.relation AND a.attnum > 0 AND NOT a.attisdropped
            AND a.attname <> ALL (hidden)) x
    WHERE x.test IS NOT NULL;
    RETURN format('SELECT %L::text AS table_name, sync_internal.canonical(jsonb_build_object(%s)) AS key, '
                  '%s AS body, %L::text AS match, %s AS value, '
                  '%s AS part FROM %s t',
                  c.table_name, key_object,
                  format('CASE WHEN coalesce(%s, false) THEN %L ELSE '
                         'sync_internal.canonical_row(to_json(t.*), %L::text[]) END',
                         coalesce(not_exact, 'false'), '{"":"\u0000not exact"}', hidden),
                  CASE c.audience WHEN 'own' THEN 'id' WHEN 'group' THEN c.replica_column ELSE '*' END,
                  CASE c.audience WHEN 'all' THEN '''''::text' WHEN 'nobody' THEN 'NULL::text'
                                  ELSE format('t.%I::text', c.to_column) END,
                  CASE WHEN r.partitioned_by IS NULL THEN '''''::text'
                       ELSE format('coalesce(t.%I::text, '''')', r.partitioned_by) END,
                  c.relation)
           || CASE WHEN for_replica
                   THEN format(' JOIN (SELECT * FROM %s WHERE coalesce((%s), false)) rep '
                               'ON rep.id = $1 AND %s',
                               r.relation, r.live, sync.audience_sql(c.id, 't', 'rep'))
                   ELSE '' END;
END
$$;

-- The codecs whose tables exist, in name order: what the truth functions read.
CREATE FUNCTION sync_internal.declared_codecs() RETURNS SETOF int
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.id FROM sync.codec c
    WHERE EXISTS (SELECT FROM pg_class t WHERE t.oid = c.relation)
    ORDER BY c.table_name
$$;

-- What `replica` must hold: one row per row of a synced table in its audience, with its key and
-- row in canonical form, h (the hex SHA-256 of the row, the version the server sends), the scope
-- it lives in, and whether it is withheld (too big for any message: the replica is told so and
-- does not hold it). A replica that is not live must hold nothing.
CREATE FUNCTION sync.expected(replica uuid)
RETURNS TABLE (table_name text, key text, "row" text, h text, scope text, withheld boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    codec int;
BEGIN
    IF NOT EXISTS (SELECT FROM sync.replica_set) THEN
        RETURN;
    END IF;
    FOR codec IN SELECT sync_internal.declared_codecs() LOOP
        RETURN QUERY EXECUTE format(
            'SELECT d.table_name, d.key, d.body, encode(sha256(convert_to(d.body, ''UTF8'')), ''hex''), '
            'sync_internal.scope_name(d.match, d.value, d.part), '
            'NOT sync_internal.row_travels(sync_internal.scope_name(d.match, d.value, d.part), d.table_name, d.key, d.body) '
            'FROM (%s) d ORDER BY d.key', sync_internal.declared_rows_sql(codec, true))
        USING replica;
    END LOOP;
END
$$;
SELECT sync_internal.pin_output_settings('sync.expected(uuid)');

-- The scopes every live replica belongs to by the declarations, read from the replicas relation:
-- all (of its partition), its own, and one for each replica column a group codec matches on.
CREATE FUNCTION sync_internal.declared_members() RETURNS TABLE (replica uuid, match text, value text, part text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r sync.replica_set;
    groups text;
BEGIN
    SELECT * INTO r FROM sync.replica_set;
    IF r.relation IS NULL OR NOT EXISTS (SELECT FROM pg_class t WHERE t.oid = r.relation) THEN
        RETURN;
    END IF;
    SELECT string_agg(format(', (%L, t.%I::text)', g, g), '' ORDER BY g) INTO groups
    FROM (SELECT DISTINCT c.replica_column AS g FROM sync.codec c WHERE c.audience = 'group') x;
    RETURN QUERY EXECUTE format(
        'SELECT t.id, m.match, m.value, %s FROM (SELECT * FROM %s WHERE coalesce((%s), false)) t '
        'CROSS JOIN LATERAL (VALUES (''*'', ''''::text), (''id'', t.id::text)%s) AS m(match, value) '
        'WHERE m.value IS NOT NULL',
        CASE WHEN r.partitioned_by IS NULL THEN '''''::text'
             ELSE format('coalesce(t.%I::text, '''')', r.partitioned_by) END,
        r.relation, r.live, coalesce(groups, ''));
END
$$;
SELECT sync_internal.pin_output_settings('sync_internal.declared_members()');

-- Scopes whose running fingerprint the last audit found unlike their tables': the next pass
-- counts each again from sync.row, while the codecs noted whole plan sync.row again from the
-- tables (in either order the two meet in the tables' fingerprint).
CREATE TABLE sync.drifted_scope (
    scope bigint PRIMARY KEY
);

-- The truth audit: every scope's fingerprint recomputed from the tables, through the declared
-- rules, against the relay's (its running one in sync.scope, and its rows in sync.row counted
-- again), and every live replica's scopes by the declarations
-- against its membership (sync.member). One statement, one snapshot: a user transaction commits
-- a change and its note together and the relay plans notes and state together, so the tables
-- equal the state but for the keys still noted (or set aside) and the rows of tables that ended
-- (sync.dropped_codec, until the next pass forgets them), which both sides leave out. What
-- disagrees is a bug of the bookkeeping: each disagreement is returned, and planned again from the
-- tables: the codecs whose rows the scope holds are noted whole and the scope's fingerprint is
-- counted again (sync.drifted_scope), a replica whose membership differs is noted.
CREATE FUNCTION sync.audit() RETURNS TABLE (scope text, replica uuid, problem text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    declared text;
BEGIN
    SELECT string_agg(format('SELECT %s AS codec, d.* FROM (%s) d', codec, sync_internal.declared_rows_sql(codec, false)),
                      ' UNION ALL ')
    INTO declared FROM sync_internal.declared_codecs() AS codec;
    IF to_regclass('pg_temp.magic_sync_audit') IS NULL THEN
        CREATE TEMP TABLE magic_sync_audit (scope text, replica uuid, problem text, codecs int[],
                                            scope_id bigint);
    END IF;
    DELETE FROM pg_temp.magic_sync_audit;
    EXECUTE format($audit$
        WITH noted AS (
            SELECT n.codec, n.key FROM sync.note n
            UNION SELECT s.codec, s.key FROM sync.set_aside s WHERE s.kind = 'note'),
        noted_keys AS (SELECT DISTINCT n.codec, sync_internal.canonical(n.key) AS key FROM noted n
                       WHERE n.key IS NOT NULL),
        noted_whole AS (SELECT DISTINCT n.codec FROM noted n WHERE n.key IS NULL),
        tables AS (
            SELECT d.codec, d.match, d.value, d.part,
                   sha256(sha256(convert_to(d.table_name, 'UTF8') || '\x00'::bytea
                                 || convert_to(d.key, 'UTF8'))
                          || sha256(convert_to(d.body, 'UTF8'))) AS element
            FROM (%s) d
            WHERE d.value IS NOT NULL
              AND sync_internal.row_travels(sync_internal.scope_name(d.match, d.value, d.part), d.table_name, d.key, d.body)
              AND NOT EXISTS (SELECT FROM noted_whole w WHERE w.codec = d.codec)
              AND NOT EXISTS (SELECT FROM noted_keys n WHERE n.codec = d.codec AND n.key = d.key)),
        held AS (
            SELECT r.scope, sync_internal.fp_element(r.k, r.hash) AS element
            FROM sync.row r
            WHERE NOT r.gone AND NOT r.withheld
              AND (EXISTS (SELECT FROM noted_whole w WHERE w.codec = r.codec)
                   -- A table that ended keeps its rows in the state until a pass forgets them.
                   OR EXISTS (SELECT FROM sync.dropped_codec d WHERE d.codec = r.codec)
                   OR EXISTS (SELECT FROM noted_keys n WHERE n.codec = r.codec
                              AND n.key = sync_internal.canonical(r.key)))),
        from_tables AS (
            SELECT t.match, t.value, t.part, sync_internal.fp_sum(t.element) AS fp, count(*) AS n,
                   array_agg(DISTINCT t.codec) AS codecs
            FROM tables t GROUP BY t.match, t.value, t.part),
        counted AS (
            SELECT r.scope, sync_internal.fp_sum(sync_internal.fp_element(r.k, r.hash)) AS fp, count(*) AS n
            FROM sync.row r WHERE NOT r.gone AND NOT r.withheld GROUP BY r.scope),
        from_state AS (
            SELECT s.id, s.match, s.value, s.partition AS part,
                   sync_internal.fp_sub(s.fp, coalesce(h.fp, sync_internal.fp_zero())) AS fp, s.n - coalesce(h.n, 0) AS n,
                   sync_internal.fp_sub(coalesce(c.fp, sync_internal.fp_zero()), coalesce(h.fp, sync_internal.fp_zero())) AS rows_fp,
                   coalesce(c.n, 0) - coalesce(h.n, 0) AS rows_n
            FROM sync.scope s
            LEFT JOIN counted c ON c.scope = s.id
            LEFT JOIN (SELECT held.scope, sync_internal.fp_sum(held.element) AS fp, count(*) AS n
                       FROM held GROUP BY held.scope) h ON h.scope = s.id)
        INSERT INTO pg_temp.magic_sync_audit (scope, problem, codecs, scope_id)
        SELECT sync_internal.scope_name(coalesce(t.match, s.match), coalesce(t.value, s.value), coalesce(t.part, s.part)),
               format('the relay''s fingerprint of this scope is not its tables'': %%s rows there, %%s in '
                      'the relay''s state', coalesce(t.n, 0), coalesce(s.n, 0)),
               ARRAY(SELECT DISTINCT x FROM unnest(coalesce(t.codecs, '{}') || ARRAY(
                         SELECT r.codec FROM sync.row r WHERE r.scope = s.id)) x ORDER BY x),
               s.id
        FROM from_tables t
        FULL JOIN from_state s ON s.match = t.match AND s.value = t.value AND s.part = t.part
        WHERE coalesce(t.n, 0) <> coalesce(s.n, 0)
           OR coalesce(t.fp, sync_internal.fp_zero()) <> coalesce(s.fp, sync_internal.fp_zero())
           OR coalesce(t.n, 0) <> coalesce(s.rows_n, 0)
           OR coalesce(t.fp, sync_internal.fp_zero()) <> coalesce(s.rows_fp, sync_internal.fp_zero())
        $audit$, coalesce(declared, 'SELECT NULL::int AS codec, NULL::text AS table_name, NULL::text AS key, '
                                    'NULL::text AS body, NULL::text AS match, NULL::text AS value, '
                                    'NULL::text AS part WHERE false'));

    -- Membership, where the replicas relation is a table: a view's changes reach the relay only
    -- when it reads the view again (magic_sync.replica_scan), so what it holds of a view may be
    -- that old without anything being wrong.
    INSERT INTO pg_temp.magic_sync_audit (scope, replica, problem)
    SELECT sync_internal.scope_name(coalesce(d.match, m.match), coalesce(d.value, m.value),
                           coalesce(d.part, m.partition)),
           coalesce(d.replica, m.replica),
           CASE WHEN m.replica IS NULL THEN 'the replica belongs to this scope but is not a member'
                ELSE 'the replica is a member of this scope but does not belong to it' END
    FROM (SELECT d.* FROM sync_internal.declared_members() d
          WHERE NOT EXISTS (SELECT FROM sync.note n WHERE n.codec = 0
                            AND (n.key IS NULL OR n.key->>'id' = d.replica::text))) d
    FULL JOIN (SELECT m.replica, s.match, s.value, s.partition
               FROM sync.member m JOIN sync.scope s ON s.id = m.scope
               JOIN sync.replica r ON r.id = m.replica AND r.live
               WHERE NOT EXISTS (SELECT FROM sync.note n WHERE n.codec = 0
                                 AND (n.key IS NULL OR n.key->>'id' = m.replica::text))) m
        ON m.replica = d.replica AND m.match = d.match AND m.value = d.value AND m.partition = d.part
    WHERE (d.replica IS NULL OR m.replica IS NULL)
      AND (SELECT c.relkind FROM sync.replica_set r JOIN pg_class c ON c.oid = r.relation) IN ('r', 'p');

    INSERT INTO sync.note (codec, key)
    SELECT DISTINCT c, NULL::jsonb FROM pg_temp.magic_sync_audit a, unnest(a.codecs) c
    UNION SELECT DISTINCT 0, jsonb_build_object('id', a.replica)
    FROM pg_temp.magic_sync_audit a WHERE a.replica IS NOT NULL;
    INSERT INTO sync.drifted_scope (scope)
    SELECT DISTINCT a.scope_id FROM pg_temp.magic_sync_audit a WHERE a.scope_id IS NOT NULL
    ON CONFLICT DO NOTHING;
    UPDATE sync.relay_state SET audited_at = now();
    IF EXISTS (SELECT FROM pg_temp.magic_sync_audit) THEN
        PERFORM sync_internal.wake();
    END IF;
    RETURN QUERY SELECT a.scope, a.replica, a.problem FROM pg_temp.magic_sync_audit a
                 ORDER BY a.scope, a.replica;
END
$$;
SELECT sync_internal.pin_output_settings('sync.audit()');

-- The rows set aside because the pass could not plan them (kind 'note') that are, by the tables
-- and the rules, in the audience of a live replica: per replica, how many it lacks (or holds in an
-- older version). Rows gone from their table since are lacked by no one. A codec whose kept keys
-- no longer read as its key (a key column's type changed since) is left out: the codec was
-- declared again and its rows planned anew.
CREATE FUNCTION sync_internal.set_aside_lacked() RETURNS TABLE (replica uuid, lacked bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c sync.codec;
    r sync.replica_set;
    key_match text;
BEGIN
    SELECT * INTO r FROM sync.replica_set;
    IF r.relation IS NULL THEN
        RETURN;
    END IF;
    FOR c IN SELECT x.* FROM sync.codec x
             WHERE x.audience <> 'nobody'
               AND EXISTS (SELECT FROM sync.set_aside s WHERE s.kind = 'note' AND s.codec = x.id)
               AND EXISTS (SELECT FROM pg_class t WHERE t.oid = x.relation)
    LOOP
        SELECT string_agg(format('t.%I = kp.%I', k, k), ' AND ') INTO key_match
        FROM unnest(c.key_columns) k;
        BEGIN
            RETURN QUERY EXECUTE format(
                'SELECT rep.id, count(*) FROM sync.set_aside s '
                'CROSS JOIN LATERAL jsonb_populate_record(NULL::%1$s, s.key) kp '
                'JOIN %1$s t ON %2$s '
                'JOIN (SELECT * FROM %3$s WHERE coalesce((%4$s), false)) rep ON %5$s '
                'WHERE s.kind = ''note'' AND s.codec = $1 GROUP BY rep.id',
                c.relation, key_match, r.relation, r.live, sync.audience_sql(c.id, 't', 'rep'))
            USING c.id;
        EXCEPTION WHEN data_exception THEN
            NULL;
        END;
    END LOOP;
END
$$;

-- A count and its noun, for the sentences sync.status says: "1 message", "2 messages".
CREATE FUNCTION sync_internal.counted(n bigint, noun text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN n || ' ' || noun || CASE WHEN n = 1 THEN '' ELSE 's' END;

-- One row per replica: live, generation, outbox depth and age, what is unconfirmed, backoff, the
-- last error, what is set aside for it, the rows it lacks and why, and its state with a sentence
-- of its figures and what to do (README.md, "What sync.status says"). The first that holds:
-- - forgotten: not live (deleted from the replicas relation, or its live condition false);
-- - failing: its deliveries fail (a backoff, refusals in a row: sync.current_delivery), or its
--   repairs do not converge (the storm breaker tripped);
-- - repairing: a repair is under way, or its report at the head differs from the server's;
-- - lacking rows: rows it should hold are withheld as too big, set aside by the pass, or it
--   reported it could not take them;
-- - in sync: the comparisons prove it: it is a member of exactly the scopes the declarations give
--   it (read from the replicas relation, not from the relay's membership), it reported each of
--   them at its head with the server's fingerprint (a scope it did not report holds no rows), no
--   audit found a scope of it drifted that the relay has not counted again. Messages delivered and
--   not confirmed yet, or unsent, do not undo it: they carry nothing its report at the head lacks;
-- - catching up: messages unsent (normal under load), or its scopes change at the next pass;
-- - waiting for its report: delivered and not confirmed yet, or confirmed but its report of what
--   it holds is behind.
-- Read through sync_internal.status(), without JIT: the planner's estimates of this query (its
-- set-returning functions at 1000 rows each) asked for JIT, whose compiling took 4.5 s a look
-- under load (tests/server/status_test.cpp) where the query itself took milliseconds. In plpgsql,
-- so that a session plans it once: as a SQL function it was planned at every look, which cost
-- twice as much as running it (9 against 4 ms a look at 100,000 rows and 2 replicas).
CREATE FUNCTION sync_internal.status()
RETURNS TABLE (replica uuid, live boolean, gen int, outbox bigint, oldest_unsent_seconds numeric,
               unconfirmed_seconds numeric, backoff_seconds numeric, last_error text,
               set_aside bigint, lacks bigint, lacks_why text, state text, state_detail text,
               uploads_refused bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $status$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH declared AS MATERIALIZED (
    SELECT d.replica, sync_internal.scope_name(d.match, d.value, d.part) AS scope
    FROM sync_internal.declared_members() d),
members AS MATERIALIZED (
    SELECT m.replica, m.scope AS id, sync_internal.scope_name(s.match, s.value, s.partition) AS scope,
           s.head, s.fp, s.n
    FROM sync.member m JOIN sync.scope s ON s.id = m.scope),
moving AS (  -- its scopes change, or are counted again, at the next pass
    SELECT coalesce(d.replica, m.replica) AS replica
    FROM declared d FULL JOIN members m ON m.replica = d.replica AND m.scope = d.scope
    WHERE d.replica IS NULL OR m.replica IS NULL
    UNION
    SELECT m.replica FROM members m JOIN sync.drifted_scope d ON d.scope = m.id),
reports AS (  -- per replica, its scopes' reports against the server's head
    SELECT m.replica,
           count(*) FILTER (WHERE CASE WHEN h.replica IS NULL THEN m.n <> 0
                                       ELSE h.through <> m.head OR h.fp <> m.fp OR h.n <> m.n END)
               AS unproven,
           count(*) FILTER (WHERE h.through = m.head AND (h.fp <> m.fp OR h.n <> m.n)) AS differing,
           max(h.reported_at) AS last_report
    FROM members m LEFT JOIN sync.holding h ON h.replica = m.replica AND h.scope = m.scope
    GROUP BY m.replica),
withheld AS MATERIALIZED (
    SELECT m.replica, count(*) AS n
    FROM sync.row w JOIN sync.member m ON m.scope = w.scope
    WHERE w.withheld AND NOT w.gone
    GROUP BY m.replica),
untaken AS MATERIALIZED (
    SELECT s.replica, count(*) AS n FROM sync.set_aside s WHERE s.kind = 'untaken'
    GROUP BY s.replica),
set_aside_lacked AS MATERIALIZED (  -- once, not once per replica
    SELECT * FROM sync_internal.set_aside_lacked()),
lacks AS (
    SELECT r.id AS replica, coalesce(w.n, 0) + coalesce(a.lacked, 0) + coalesce(u.n, 0) AS n,
           nullif(concat_ws(', ', w.n || ' withheld as too big for a message',
                            a.lacked || ' set aside by the pass (sync.set_aside)',
                            u.n || ' it could not take'), '') AS why,
           nullif(concat_ws('; ',
                            CASE WHEN w.n > 0 THEN 'raise magic_sync.bytes_per_message or make the '
                                                   'rows smaller' END,
                            CASE WHEN a.lacked > 0 THEN 'deploy a fix (the relay''s log says why; '
                                                        'sync.set_aside kind note)' END,
                            CASE WHEN u.n > 0 THEN 'see why in sync.set_aside (kind untaken) and '
                                                   'the device''s log, and fix the device or the rows'
                                 END), '') AS fix
    FROM sync.replica r
    LEFT JOIN withheld w ON w.replica = r.id
    LEFT JOIN set_aside_lacked a ON a.replica = r.id
    LEFT JOIN untaken u ON u.replica = r.id),
figures AS (
    SELECT r.id AS replica, r.live, r.gen, o.unsent AS outbox,
           extract(epoch FROM now() - o.oldest_unsent) AS oldest_unsent_seconds,
           extract(epoch FROM now() - o.first_sent) AS unconfirmed_seconds,
           CASE WHEN d.backoff_until > now() THEN extract(epoch FROM d.backoff_until - now()) END
               AS backoff_seconds,
           d.last_error,
           (SELECT count(*) FROM sync.set_aside s WHERE s.replica = r.id) AS set_aside,
           l.n AS lacks, l.why AS lacks_why, l.fix AS lacks_fix,
           coalesce(f.refused, 0) AS uploads_refused,
           o.awaiting, o.first_awaiting,
           d.backoff IS NOT NULL OR coalesce(d.refusals, 0) > 0 AS delivery_failing,
           coalesce(d.refusals, 0) AS refusals,
           greatest(extract(epoch FROM d.probe_at - now()), 0) AS probe_seconds,
           p.storms, p.repairs, p.storm_until,
           EXISTS (SELECT FROM declared x WHERE x.replica = r.id) AS declared_live,
           EXISTS (SELECT FROM members m WHERE m.replica = r.id) AS member,
           EXISTS (SELECT FROM moving x WHERE x.replica = r.id) AS moving,
           coalesce(rp.unproven, 0) AS unproven, coalesce(rp.differing, 0) AS differing,
           rp.last_report,
           (SELECT sum(h.n) FROM sync.holding h WHERE h.replica = r.id) AS last_held
    FROM sync.replica r
    JOIN lacks l ON l.replica = r.id
    LEFT JOIN sync.current_delivery d ON d.replica = r.id
    LEFT JOIN sync.upload_refusal f ON f.replica = r.id
    LEFT JOIN reports rp ON rp.replica = r.id
    CROSS JOIN LATERAL (
        -- A message the replica confirmed in an upload the relay has not taken yet is confirmed.
        SELECT count(*) FILTER (WHERE o.sent_at IS NULL) AS unsent,
               min(o.created_at) FILTER (WHERE o.sent_at IS NULL) AS oldest_unsent,
               min(o.sent_at) AS first_sent,
               count(*) FILTER (WHERE o.sent_at IS NOT NULL AND o.seq > c.applied) AS awaiting,
               min(o.sent_at) FILTER (WHERE o.seq > c.applied) AS first_awaiting
        FROM sync.outbox o
        CROSS JOIN (SELECT coalesce(max(x.applied), 0) AS applied FROM sync.confirmation x
                    WHERE x.replica = r.id) c
        WHERE o.replica = r.id) o
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE x.attempts > 0) AS storms, count(*) AS repairs,
               max(x.storm_until) AS storm_until
        FROM sync.repair x WHERE x.replica = r.id) p)
SELECT f.replica, f.live, f.gen, f.outbox, f.oldest_unsent_seconds, f.unconfirmed_seconds,
       f.backoff_seconds, f.last_error, f.set_aside, f.lacks, f.lacks_why,
       s.said[1] AS state, s.said[2] AS state_detail, f.uploads_refused
FROM figures f
CROSS JOIN LATERAL (SELECT CASE
    WHEN NOT f.live AND f.declared_live THEN ARRAY['catching up',
        'provisioned again at the relay''s next pass: it starts over with a reset']
    WHEN NOT f.live THEN ARRAY['forgotten', format(
        'not live (deleted from the replicas relation, or its live condition is false): nothing is '
        'sent to it; its device keeps what it held%s until it is wiped or made live again (then '
        'it starts over)', ' (' || f.last_held || ' rows at its last report)')]
    WHEN f.storms > 0 THEN ARRAY['failing', format(
        'repairs do not converge: the breaker tripped %s%s; look in the log for "repair '
        'storm" (its scope and tables) and deploy a fix',
        CASE WHEN f.storms = 1 THEN 'once' ELSE f.storms || ' times' END,
        CASE WHEN f.storm_until > now() THEN format(', the next repair in %s s',
                                                    ceil(extract(epoch FROM f.storm_until - now())))
        END)]
    WHEN f.delivery_failing THEN ARRAY['failing', format(
        'delivery failing: %s; %s%s; %s', coalesce(f.last_error, 'no error recorded'),
        CASE WHEN f.refusals > 0 THEN sync_internal.counted(f.refusals, 'refusal') || ' in a row; ' END,
        CASE WHEN f.backoff_seconds IS NULL THEN 'next try now'
             ELSE format('next try in %s s', ceil(f.backoff_seconds)) END,
        CASE WHEN f.refusals > 0
             THEN 'its device refuses its messages: see its log (after magic_sync.max_refusals in a '
                  'row it is provisioned again)'
             ELSE format('check its line; it is noticed once it answers, at its %snext ask or '
                         'upload', 'next probe (in ' || ceil(f.probe_seconds) || ' s), ') END)]
    WHEN f.repairs > 0 OR f.differing > 0 THEN ARRAY['repairing', CASE WHEN f.repairs > 0
        THEN format('%s of its scopes %s repaired by range; nothing to do', f.repairs,
                    CASE WHEN f.repairs = 1 THEN 'is being' ELSE 'are being' END)
        ELSE format('its report differs from the server''s in %s: the relay repairs it at '
                    'its next pass; nothing to do', sync_internal.counted(f.differing, 'scope')) END]
    WHEN f.lacks > 0 THEN ARRAY['lacking rows', format('lacks %s: %s; %s',
                                                        sync_internal.counted(f.lacks, 'row'),
                                                        f.lacks_why, f.lacks_fix)]
    WHEN f.member AND NOT f.moving AND f.unproven = 0 THEN ARRAY['in sync',
        CASE WHEN f.awaiting > 0
             THEN format('its last report matches the server; %s delivered %s not confirmed yet',
                         sync_internal.counted(f.awaiting, 'message'),
                         CASE WHEN f.awaiting = 1 THEN 'is' ELSE 'are' END)
             ELSE 'its last report matches the server' END]
    WHEN f.outbox > 0 THEN ARRAY['catching up', format(
        '%s unsent, the oldest %s s; normal under load, look again if the oldest keeps '
        'growing', sync_internal.counted(f.outbox, 'message'), floor(f.oldest_unsent_seconds))]
    WHEN f.moving OR NOT f.member THEN ARRAY['catching up',
        'its scopes change at the relay''s next pass']
    WHEN f.awaiting > 0 THEN ARRAY['waiting for its report', format(
        '%s delivered and not confirmed yet, the oldest sent %s s ago; it confirms in '
        'its next upload', sync_internal.counted(f.awaiting, 'message'),
        floor(extract(epoch FROM now() - f.first_awaiting)))]
    ELSE ARRAY['waiting for its report', format(
        'everything delivered is confirmed; its report of what it holds is behind in %s '
        '(last report %s); it reports in its next upload', sync_internal.counted(f.unproven, 'scope'),
        coalesce(floor(extract(epoch FROM now() - f.last_report)) || ' s ago', 'none yet'))]
END AS said) s;
END
$status$;

CREATE VIEW sync.status AS SELECT * FROM sync_internal.status();

-- For monitoring (packaging/postgres_exporter_queries.yaml, for prometheus-postgres-exporter):
-- the replicas counted by what sync.status says of them, and the relay's health, which the
-- role sync_monitor may read and nothing else of sync. One reading of sync.status per call: it
-- compares every replica's holdings, so scrape it every 15 s or slower.
CREATE FUNCTION sync.replica_counts()
RETURNS TABLE (state text, live boolean, replicas bigint, unsent bigint,
               oldest_unsent_seconds float8, set_aside bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.state, s.live, count(*), sum(s.outbox)::bigint,
           coalesce(max(s.oldest_unsent_seconds), 0)::float8, sum(s.set_aside)::bigint
    FROM sync.status s GROUP BY s.state, s.live ORDER BY s.state, s.live
$$;

CREATE FUNCTION sync.relay_health()
RETURNS TABLE (notes_backlog bigint, oldest_note_seconds float8, relay_running boolean,
               last_pass_seconds float8, set_aside_notes bigint, set_aside_rows bigint,
               set_aside_uploads bigint, set_aside_untaken bigint, horizon_seconds float8)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT h.notes_backlog::bigint, coalesce(h.oldest_note_seconds, 0)::float8,
           h.relay_pid IS NOT NULL, coalesce(extract(epoch FROM now() - h.last_pass_at), -1)::float8,
           h.set_aside_notes, h.set_aside_rows, h.set_aside_uploads, h.set_aside_untaken,
           coalesce(h.horizon_seconds, 0)::float8
    FROM sync.health h
$$;

REVOKE ALL ON FUNCTION sync.replica_counts(), sync.relay_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sync.replica_counts(), sync.relay_health() TO sync_monitor;
