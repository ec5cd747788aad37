
-- magic_sync 0.1.0 -> 0.2.0, the part after the install script: 0.1.0's state comes back from
-- sync_0_1_0 into 0.2.0's tables, column by column under the same names (a column 0.2.0 added
-- takes its default), its sequences go on where they were, and the declarations are made again
-- under 0.2.0's rules (the capture triggers in 0.2.0's form, every synced table planned again
-- whole: what did not change is not sent again; a table dropped under 0.1.0 ends).
DO $bring_back$
DECLARE
    old_table record;
    columns text;
    expressions text;
    extra_columns text;
    extra_expressions text;
    old_sequence record;
BEGIN
    -- Foreign keys are checked once all is back, not table by table.
    PERFORM set_config('session_replication_role', 'replica', true);
    FOR old_table IN
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = 'sync_0_1_0'::regnamespace AND c.relkind IN ('r', 'p')
          AND to_regclass(format('sync.%I', c.relname)) IS NOT NULL
        ORDER BY c.relname
    LOOP
        SELECT string_agg(quote_ident(n.attname), ', ' ORDER BY n.attnum),
               string_agg(format('%I::%s', n.attname, format_type(n.atttypid, n.atttypmod)), ', '
                          ORDER BY n.attnum)
        INTO columns, expressions
        FROM pg_attribute n
        JOIN pg_attribute o ON o.attrelid = format('sync_0_1_0.%I', old_table.relname)::regclass
                           AND o.attname = n.attname AND o.attnum > 0 AND NOT o.attisdropped
        WHERE n.attrelid = format('sync.%I', old_table.relname)::regclass AND n.attnum > 0
          AND NOT n.attisdropped AND n.attgenerated = '';
        -- What 0.2.0 cannot take from 0.1.0 as it was: a codec's audience and key types, set
        -- here to pass its checks and made right when it is declared again below.
        extra_columns := CASE old_table.relname WHEN 'codec' THEN ', audience, key_types' ELSE '' END;
        extra_expressions := CASE old_table.relname
            WHEN 'codec' THEN ', ''nobody'', coalesce(sync_internal.column_types(relation, key_columns), ''{}'')'
            ELSE '' END;
        EXECUTE format('DELETE FROM sync.%I', old_table.relname);
        EXECUTE format('INSERT INTO sync.%I (%s%s) OVERRIDING SYSTEM VALUE SELECT %s%s FROM sync_0_1_0.%I',
                       old_table.relname, columns, extra_columns, expressions, extra_expressions,
                       old_table.relname);
    END LOOP;
    PERFORM set_config('session_replication_role', 'origin', true);
    FOR old_sequence IN
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = 'sync_0_1_0'::regnamespace AND c.relkind = 'S'
          AND to_regclass(format('sync.%I', c.relname)) IS NOT NULL
    LOOP
        EXECUTE format('SELECT setval(''sync.%I'', last_value, is_called) FROM sync_0_1_0.%I',
                       old_sequence.relname, old_sequence.relname);
    END LOOP;
END
$bring_back$;

-- The replicas' reports as 0.2.0 would have written them: settled where they match their scope
-- (the pass looks for repairs only among the others).
UPDATE sync.holding h SET settled = sync_internal.report_settled(h.through, h.fp, h.n, s)
FROM sync.scope s WHERE sync_internal.scope_name(s.match, s.value, s.partition) = h.scope;

-- A kept upload's row names its table since 0.2.0 (0.1.0 kept the row as uploaded, {"t", "r"},
-- and a message kept whole as it came): each is tried again at once under 0.2.0's filing.
DO $kept_uploads$
DECLARE
    kept record;
BEGIN
    FOR kept IN SELECT s.id, s.body FROM sync.set_aside s WHERE s.kind = 'upload' LOOP
        BEGIN
            UPDATE sync.set_aside s SET table_name = row_as_uploaded->>'t'
            FROM (SELECT convert_from(kept.body, 'UTF8')::jsonb AS row_as_uploaded) r
            WHERE s.id = kept.id AND jsonb_typeof(r.row_as_uploaded) = 'object'
              AND r.row_as_uploaded ? 'r' AND jsonb_typeof(r.row_as_uploaded->'t') = 'string';
        EXCEPTION WHEN OTHERS THEN
            NULL;  -- not JSON: a message kept whole
        END;
    END LOOP;
    UPDATE sync.set_aside SET next_try_at = now(), change_seen = sync_internal.filing_change_committed()
    WHERE kind = 'upload';
END
$kept_uploads$;

-- The declarations again, under 0.2.0's rules and capture.
DO $declare_again$
DECLARE
    declared sync.codec;
BEGIN
    IF EXISTS (SELECT FROM sync.replica_set s JOIN pg_class c ON c.oid = s.relation
               WHERE c.relkind IN ('r', 'p')) THEN
        PERFORM sync_internal.install_capture((SELECT s.relation FROM sync.replica_set s), 0,
                                     ARRAY['id']::name[]);
    END IF;
    INSERT INTO sync.note (codec, key) SELECT 0, NULL FROM sync.replica_set;
    FOR declared IN SELECT * FROM sync.codec ORDER BY id LOOP
        IF EXISTS (SELECT FROM pg_class c WHERE c.oid = declared.relation) THEN
            PERFORM sync_internal.codec(declared.relation, declared.kind, declared."to", declared.columns,
                               declared.replica_columns, declared.stamp);
        ELSE
            -- Dropped under 0.1.0, which did not notice: it ends now, and every replica that
            -- holds rows of it drops the table, as DROP TABLE does in 0.2.0.
            PERFORM sync.end_codec(declared.id);
        END IF;
    END LOOP;
END
$declare_again$;

DROP SCHEMA sync_0_1_0 CASCADE;

-- 0.1.0's tables were marked for pg_dump (pg_extension_config_dump), and dropping a table inside
-- the extension's script leaves its mark: only 0.2.0's stay.
UPDATE pg_catalog.pg_extension e SET extconfig = kept.config, extcondition = kept.conditions
FROM (SELECT array_agg(u.config ORDER BY u.n) AS config, array_agg(u.condition ORDER BY u.n) AS conditions
      FROM pg_catalog.pg_extension x,
           unnest(x.extconfig, x.extcondition) WITH ORDINALITY AS u(config, condition, n)
      WHERE x.extname = 'magic_sync'
        AND EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid = u.config)) kept
WHERE e.extname = 'magic_sync';
