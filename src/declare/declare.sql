-- Declaring what syncs (docs/DESIGN.md §2) ----------------------------------------------------------------
--
-- Declarations validate against the catalog at once and refuse with a message that says what is
-- wrong and how to fix it. Every identifier they splice into SQL comes from the catalog and is
-- quoted with format('%I').

-- The capture trigger (src/capture/trigger.cpp). It inserts its notes into sync.note's heap
-- itself, so whoever writes a synced table notes its changes without any privilege on sync; it
-- runs no SQL, so it needs no SET search_path (which would cost a settings save and restore on
-- every statement of the application). OR REPLACE: an update from an older release keeps the
-- function the tables' triggers call (src/upgrade/) and replaces it here.
CREATE OR REPLACE FUNCTION sync.capture() RETURNS trigger
AS 'MODULE_PATHNAME', 'magic_sync_capture'
LANGUAGE C;

-- The keys a capture note holds (sync.note.keys), as jsonb, in the order they were noted; one
-- NULL (every row of the codec) when a key column's type no longer exists.
CREATE FUNCTION sync.note_keys(keys bytea) RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'magic_sync_note_keys'
LANGUAGE C STABLE STRICT;

-- The first `most` of them: a pass that takes part of a big note reads that part only.
CREATE FUNCTION sync.note_keys(keys bytea, most int) RETURNS SETOF jsonb
AS 'MODULE_PATHNAME', 'magic_sync_note_keys'
LANGUAGE C STABLE STRICT;

-- What is left of a note's keys from the first-th on: a pass that takes part of a big note
-- leaves the rest for the next.
CREATE FUNCTION sync_internal.note_keys_from(keys bytea, first int) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_note_keys_from'
LANGUAGE C IMMUTABLE STRICT;

-- The notes waiting for the pass, a row per key (key NULL: every row of the codec), `position`
-- its place in its note.
CREATE VIEW sync.noted AS
SELECT n.seq, n.codec, k.key, k.position, n.key_count, n.noted_at
FROM sync.note n
CROSS JOIN LATERAL (SELECT n.key, 1::bigint WHERE n.keys IS NULL
                    UNION ALL
                    SELECT * FROM sync.note_keys(n.keys) WITH ORDINALITY) AS k(key, position);

-- The relation's name as it travels on the wire and shows in messages: schema.name.
CREATE FUNCTION sync_internal.relation_name(relation regclass) RETURNS text
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('%I.%I', n.nspname, c.relname)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = relation
$$;

-- The type of a column of a relation, or NULL when it has no such column.
CREATE FUNCTION sync_internal.column_type(relation regclass, column_name name) RETURNS regtype
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.atttypid::regtype FROM pg_attribute a
    WHERE a.attrelid = relation AND a.attname = column_name AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- The types of columns of a relation, in the order named (NULL for a column it does not have).
CREATE FUNCTION sync_internal.column_types(relation regclass, column_names name[]) RETURNS regtype[]
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT array_agg(sync_internal.column_type(relation, c.name) ORDER BY c.position)
    FROM unnest(column_names) WITH ORDINALITY AS c(name, position)
$$;

-- What ALTER TYPE may change of the types of a table's key columns, in key order.
CREATE FUNCTION sync_internal.key_definitions(relation regclass, keys name[]) RETURNS text
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT string_agg(sync_internal.type_definition(a.atttypid), ', ' ORDER BY k.position)
    FROM unnest(keys) WITH ORDINALITY AS k(name, position)
    JOIN pg_attribute a ON a.attrelid = relation AND a.attname = k.name
$$;

-- A table's columns and their types, in order: what a schema change that matters to its rows
-- changes.
CREATE FUNCTION sync_internal.table_shape(relation regclass) RETURNS text
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(string_agg(format('%I %s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                                      sync_internal.type_definition(a.atttypid)), ', '
                               ORDER BY a.attnum), '')
    FROM pg_attribute a
    WHERE a.attrelid = relation AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- What ALTER TYPE may change of a type that alters its values' text, however deep: an enum's
-- labels in order, a composite's attributes with their types; through a domain, an array, a
-- range or a multirange to the type it is made of ('' for a type made of none of these).
CREATE FUNCTION sync_internal.type_definition(type oid) RETURNS text
LANGUAGE plpgsql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t pg_type;
BEGIN
    SELECT * INTO t FROM pg_type y WHERE y.oid = type;
    IF t.typtype = 'e' THEN
        RETURN (SELECT ' (' || string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder)
                       || ')'
                FROM pg_enum e WHERE e.enumtypid = type);
    ELSIF t.typtype = 'c' THEN
        RETURN (SELECT ' (' || string_agg(format('%I %s%s', a.attname,
                                                 format_type(a.atttypid, a.atttypmod),
                                                 sync_internal.type_definition(a.atttypid)),
                                          ', ' ORDER BY a.attnum) || ')'
                FROM pg_attribute a
                WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped);
    ELSIF t.typtype = 'd' THEN
        RETURN sync_internal.type_definition(t.typbasetype);
    ELSIF t.typtype = 'r' THEN
        RETURN sync_internal.type_definition(
            (SELECT r.rngsubtype FROM pg_range r WHERE r.rngtypid = type));
    ELSIF t.typtype = 'm' THEN
        RETURN sync_internal.type_definition(
            (SELECT r.rngtypid FROM pg_range r WHERE r.rngmultitypid = type));
    ELSIF t.typcategory = 'A' AND t.typelem <> 0 THEN
        RETURN sync_internal.type_definition(t.typelem);
    END IF;
    RETURN '';
END
$$;

-- The primary key columns of a table, in key order (NULL when it has none).
CREATE FUNCTION sync_internal.key_columns(relation regclass) RETURNS name[]
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT array_agg(a.attname ORDER BY k.ord)
    FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = relation AND i.indisprimary
$$;

-- The columns a row of `relation` cannot be without: NOT NULL, and nothing fills them in (no
-- default, no identity; a generated column has a default).
CREATE FUNCTION sync_internal.required_columns(relation regclass) RETURNS name[]
LANGUAGE plpgsql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(a.attname ORDER BY a.attnum), '{}')
            FROM pg_attribute a
            WHERE a.attrelid = relation AND a.attnum > 0 AND NOT a.attisdropped
              AND a.attnotnull AND NOT a.atthasdef AND a.attidentity = '');
END
$$;

-- Refuses unless every column in `columns` exists in `relation`; `what` names the argument.
CREATE FUNCTION sync_internal.require_columns(relation regclass, columns name[], what text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    missing name;
BEGIN
    SELECT c INTO missing FROM unnest(columns) c WHERE sync_internal.column_type(relation, c) IS NULL LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION '% names column "%", which table % does not have',
                        what, missing, sync_internal.relation_name(relation)
            USING ERRCODE = 'undefined_column',
                  HINT = format('The columns of %s are: %s.', sync_internal.relation_name(relation),
                                (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
                                 FROM pg_attribute a
                                 WHERE a.attrelid = relation AND a.attnum > 0 AND NOT a.attisdropped));
    END IF;
END
$$;

-- Installs the capture triggers on a relation: a row trigger that keeps each changed key until
-- the transaction commits, and a statement trigger for TRUNCATE (src/capture/trigger.cpp).
CREATE FUNCTION sync_internal.install_capture(relation regclass, codec int, key_columns name[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    args text := (SELECT string_agg(quote_literal(a), ', ')
                  FROM unnest(ARRAY[codec::text] || key_columns::text[]) a);
BEGIN
    PERFORM sync_internal.remove_capture(relation);
    EXECUTE format('CREATE TRIGGER magic_sync_change AFTER INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH ROW EXECUTE FUNCTION sync.capture(%s)', relation, args);
    EXECUTE format('CREATE TRIGGER magic_sync_truncate AFTER TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION sync.capture(%s)', relation, args);
END
$$;

-- Whether a relation has the triggers sync_internal.install_capture makes.
CREATE FUNCTION sync_internal.capture_installed(relation regclass) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(t.tgname ORDER BY t.tgname), '{}') = '{magic_sync_change,magic_sync_truncate}'
    FROM pg_trigger t
    WHERE t.tgrelid = relation AND t.tgfoid = 'sync.capture()'::regprocedure
$$;

CREATE FUNCTION sync_internal.remove_capture(relation regclass) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    trigger_name name;
BEGIN
    FOR trigger_name IN
        SELECT t.tgname FROM pg_trigger t
        WHERE t.tgrelid = relation AND t.tgfoid = 'sync.capture()'::regprocedure
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trigger_name, relation);
    END LOOP;
END
$$;

-- Refuses a `live` expression that does not parse over `relation` or is not boolean.
CREATE FUNCTION sync_internal.require_live(relation regclass, live text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    live_type regtype;
BEGIN
    BEGIN
        -- One row of NULLs: the expression's type without reading the relation.
        EXECUTE format('SELECT pg_typeof((%s)) FROM (SELECT * FROM %s LIMIT 0) AS r '
                       'RIGHT JOIN (VALUES (1)) AS one(x) ON true', live, relation)
            INTO live_type;
    EXCEPTION WHEN syntax_error OR undefined_column OR undefined_function OR datatype_mismatch
                   OR undefined_table OR ambiguous_column THEN
        RAISE EXCEPTION 'live expression "%" is not valid over %: %',
                        live, sync_internal.relation_name(relation), SQLERRM
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'live is a boolean SQL expression over the columns of the replicas '
                         'relation, such as ''active'' or ''status = ''''open''''''.';
    END;
    IF live_type IS DISTINCT FROM 'boolean'::regtype THEN
        RAISE EXCEPTION 'live expression "%" is of type %, not boolean', live, live_type
            USING ERRCODE = 'datatype_mismatch',
                  HINT = 'live says which rows of the replicas relation are live replicas: '
                         'write a condition, such as ''active'' or ''closed_at IS NULL''.';
    END IF;
END
$$;

-- Declares the relation that lists the replicas. Redeclaring replaces the declaration.
-- `transport`, a column of it whose value names the transport that delivers each replica ('http',
-- 'nats', 'exec' or 'pull'): a sender leases only the replicas of its --transport, so push and pull
-- senders share one database without delivering a replica twice. Without it, every sender
-- delivers every replica.
CREATE FUNCTION sync.replicas(relation regclass, name text, live text DEFAULT 'true',
                              partitioned_by name DEFAULT NULL, transport name DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char" := (SELECT c.relkind FROM pg_class c WHERE c.oid = relation);
    id_type regtype := sync_internal.column_type(relation, 'id');
    previous regclass := (SELECT s.relation FROM sync.replica_set s);
    lacking text;
BEGIN
    IF kind NOT IN ('r', 'p', 'v', 'm', 'f') THEN
        RAISE EXCEPTION '% is not a table or a view', sync_internal.relation_name(relation)
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF id_type IS DISTINCT FROM 'uuid'::regtype THEN
        RAISE EXCEPTION 'replicas relation % has no column "id" of type uuid%',
                        sync_internal.relation_name(relation),
                        CASE WHEN id_type IS NULL THEN '' ELSE format(' (its "id" is %s)', id_type) END
            USING ERRCODE = 'invalid_table_definition',
                  HINT = 'Each row of the replicas relation is a replica, identified by an id '
                         'of type uuid: add that column, or declare a view that has it.';
    END IF;
    IF name IS NULL OR name !~ '^[a-z_][a-z0-9_]*$' THEN
        RAISE EXCEPTION 'replica set name "%" must be a lower-case identifier', name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The name shows in messages and logs, e.g. ''registers''.';
    END IF;
    PERFORM sync_internal.require_live(relation, coalesce(live, 'true'));
    IF partitioned_by IS NOT NULL THEN
        PERFORM sync_internal.require_columns(relation, ARRAY[partitioned_by], 'partitioned_by');
        SELECT string_agg(c.table_name, ', ' ORDER BY c.table_name) INTO lacking
        FROM sync.codec c WHERE sync_internal.column_type(c.relation, partitioned_by) IS NULL;
        IF lacking IS NOT NULL THEN
            RAISE EXCEPTION 'column "%", which the replicas would be partitioned by, is missing from synced table(s) %',
                            partitioned_by, lacking
                USING ERRCODE = 'undefined_column',
                      HINT = 'No row crosses a partition, so every synced table needs the '
                             'partition column: add it, or sync.drop() the table first.';
        END IF;
    END IF;

    IF transport IS NOT NULL THEN
        PERFORM sync_internal.require_columns(relation, ARRAY[transport], 'transport');
    END IF;

    IF previous IS NOT NULL AND previous <> relation THEN
        PERFORM sync_internal.remove_capture(previous);
    END IF;
    INSERT INTO sync.replica_set AS s (relation, relation_name, name, live, partitioned_by, transport)
    VALUES (relation, sync_internal.relation_name(relation), name, coalesce(live, 'true'), partitioned_by,
            transport)
    ON CONFLICT (singleton) DO UPDATE
        SET relation = excluded.relation, relation_name = excluded.relation_name,
            name = excluded.name, live = excluded.live, partitioned_by = excluded.partitioned_by,
            transport = excluded.transport;
    IF kind IN ('r', 'p') THEN
        PERFORM sync_internal.install_capture(relation, 0, ARRAY['id']::name[]);
    END IF;
    -- Every replica is looked at again by the next pass.
    INSERT INTO sync.note (codec, key) VALUES (0, NULL);
    PERFORM sync_internal.wake();
END
$$;

-- The replicas columns that group codecs match on: a replica's groups are a scope each.
CREATE FUNCTION sync_internal.group_columns() RETURNS name[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(DISTINCT c.replica_column ORDER BY c.replica_column), '{}')
    FROM sync.codec c WHERE c.audience = 'group'
$$;

-- After a declaration changed: the next pass looks at every row of the codec, and at every
-- replica too when the columns that group them changed (they join or leave those scopes).
CREATE FUNCTION sync_internal.declared(codec int, groups_before name[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF codec IS NOT NULL THEN
        INSERT INTO sync.note (codec, key) VALUES (declared.codec, NULL);
    END IF;
    IF sync_internal.group_columns() IS DISTINCT FROM groups_before THEN
        INSERT INTO sync.note (codec, key) VALUES (0, NULL);
    END IF;
    PERFORM sync_internal.wake();
END
$$;

-- Declares how a table syncs. sync.catalog(), sync.record() and sync.both() are sugar for it.
CREATE FUNCTION sync_internal.codec("table" regclass, kind text, "to" text DEFAULT NULL,
                           columns name[] DEFAULT NULL, replica_columns name[] DEFAULT '{}',
                           stamp name[] DEFAULT '{}') RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    relation regclass := "table";
    table_name text := sync_internal.relation_name("table");
    relkind "char" := (SELECT c.relkind FROM pg_class c WHERE c.oid = "table");
    keys name[] := sync_internal.key_columns("table");
    replica_set sync.replica_set;
    previous sync.codec;
    holder regclass;
    groups_before name[] := sync_internal.group_columns();
    parsed text[];
    audience text;
    to_column name;
    replica_column name;
    own_type regtype;
    replica_type regtype;
    codec_id int;
    offending name;
    json_column record;
BEGIN
    IF kind IS NULL OR kind NOT IN ('catalog', 'record', 'both') THEN
        RAISE EXCEPTION 'codec kind "%" is not one of catalog, record, both', kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF relkind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table: only tables sync', table_name
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Declare the table the rows live in (a view cannot be captured or filed).';
    END IF;
    IF keys IS NULL THEN
        RAISE EXCEPTION 'table % has no primary key', table_name
            USING ERRCODE = 'invalid_table_definition',
                  HINT = format('Rows are found, sent and filed by primary key: add one, e.g. '
                                'ALTER TABLE %s ADD PRIMARY KEY (id).', table_name);
    END IF;
    SELECT * INTO replica_set FROM sync.replica_set;
    SELECT * INTO previous FROM sync.codec c WHERE c.relation = "table";
    SELECT c.relation INTO holder FROM sync.codec c
    WHERE c.table_name = sync_internal.relation_name("table") AND c.relation <> "table";
    IF holder IS NOT NULL THEN
        RAISE EXCEPTION 'the name % is still declared for table %, which was renamed', table_name,
                        coalesce(sync_internal.relation_name(holder), '(dropped)')
            USING ERRCODE = 'duplicate_object',
                  HINT = format('Redeclare that table under its new name first, or sync.drop(%L).',
                                coalesce(sync_internal.relation_name(holder), table_name));
    END IF;

    -- Who receives a row: 'all', 'col' (holds a replica id), 'col = replica_col', or NULL. Parsed
    -- here, once, into audience, to_column and replica_column; nothing parses "to" again.
    "to" := btrim("to");
    IF "to" IS NULL THEN
        audience := 'nobody';
    ELSIF "to" = 'all' THEN
        audience := 'all';
    ELSE
        -- A column is named as written, or double-quoted as in SQL ("group", "Mixed Case").
        parsed := regexp_match("to", '^([A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")\s*'
                                     '(?:=\s*([A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+"))?$');
        IF parsed IS NULL THEN
            RAISE EXCEPTION 'to => ''%'' is not one of ''all'', ''column'' or ''column = replica_column''', "to"
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'E.g. to => ''register_id'' (the column holds a replica id) or '
                             'to => ''store_id = store_id'' (every replica of that store).';
        END IF;
        to_column := CASE WHEN parsed[1] LIKE '"%'
                          THEN replace(substr(parsed[1], 2, length(parsed[1]) - 2), '""', '"')
                          ELSE parsed[1] END;
        replica_column := CASE WHEN parsed[2] LIKE '"%'
                               THEN replace(substr(parsed[2], 2, length(parsed[2]) - 2), '""', '"')
                               ELSE parsed[2] END;
        audience := CASE WHEN replica_column IS NULL THEN 'own' ELSE 'group' END;
        PERFORM sync_internal.require_columns("table", ARRAY[to_column], 'to');
        own_type := sync_internal.column_type("table", to_column);
        IF audience = 'own' THEN
            IF own_type <> 'uuid'::regtype THEN
                RAISE EXCEPTION 'to => ''%'': column %.% is of type %, but a column that names the '
                                'receiving replica must be uuid', "to", table_name, to_column, own_type
                    USING ERRCODE = 'datatype_mismatch',
                          HINT = 'Use to => ''column = replica_column'' to send a row to every '
                                 'replica whose column has the same value.';
            END IF;
        ELSE
            IF replica_set IS NULL THEN
                RAISE EXCEPTION 'to => ''%'' matches a column of the replicas, but no replicas are declared', "to"
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          HINT = 'Declare them first with sync.replicas().';
            END IF;
            replica_type := sync_internal.column_type(replica_set.relation, replica_column);
            IF replica_type IS NULL THEN
                RAISE EXCEPTION 'to => ''%'': the replicas relation % has no column "%"',
                                "to", replica_set.relation_name, replica_column
                    USING ERRCODE = 'undefined_column';
            END IF;
            IF replica_type <> own_type THEN
                RAISE EXCEPTION 'to => ''%'': column %.% is of type % but %.% is of type %',
                                "to", table_name, to_column, own_type,
                                replica_set.relation_name, replica_column, replica_type
                    USING ERRCODE = 'datatype_mismatch',
                          HINT = 'The two columns are compared for equality: make them the same type.';
            END IF;
        END IF;
    END IF;

    IF columns IS NOT NULL THEN
        PERFORM sync_internal.require_columns("table", columns, 'columns');
        SELECT k INTO offending FROM unnest(keys) k WHERE k <> ALL (columns) LIMIT 1;
        IF offending IS NOT NULL THEN
            RAISE EXCEPTION 'columns must include the key column "%" of %', offending, table_name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A replica finds a row by its key: add the key columns to columns.';
        END IF;
    END IF;

    SELECT * INTO json_column FROM sync_internal.json_column_problem("table", columns);
    IF FOUND THEN
        RAISE EXCEPTION '%', json_column.problem
            USING ERRCODE = 'datatype_mismatch', HINT = json_column.fix;
    END IF;

    replica_columns := coalesce(replica_columns, '{}');
    IF kind <> 'both' AND cardinality(replica_columns) > 0 THEN
        RAISE EXCEPTION 'replica_columns are only for tables both sides write (sync.both()), not % tables', kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sync_internal.require_columns("table", replica_columns, 'replica_columns');
    SELECT k INTO offending FROM unnest(keys) k WHERE k = ANY (replica_columns) LIMIT 1;
    IF offending IS NOT NULL THEN
        RAISE EXCEPTION 'replica_columns may not include the key column "%" of %', offending, table_name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A replica writes the columns of a row it holds; it cannot change the key.';
    END IF;
    IF columns IS NOT NULL THEN
        SELECT c INTO offending FROM unnest(replica_columns) c WHERE c <> ALL (columns) LIMIT 1;
        IF offending IS NOT NULL THEN
            RAISE EXCEPTION 'replica column "%" of % is not among the columns that travel', offending, table_name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Add it to columns: a replica writes only what it holds.';
        END IF;
    END IF;

    stamp := coalesce(stamp, '{}');
    IF kind = 'catalog' AND cardinality(stamp) > 0 THEN
        RAISE EXCEPTION 'stamp is for tables filed from uploads (record, both), not catalog tables'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sync_internal.require_columns("table", stamp, 'stamp');

    IF replica_set.partitioned_by IS NOT NULL
       AND sync_internal.column_type("table", replica_set.partitioned_by) IS NULL THEN
        RAISE EXCEPTION 'table % has no column "%", which the replicas are partitioned by',
                        table_name, replica_set.partitioned_by
            USING ERRCODE = 'undefined_column',
                  HINT = 'No row crosses a partition: add the column to the table.';
    END IF;

    -- Rows travel under the table's name and are found by its key: declared under another name or
    -- key, the table's rows are other rows. The codec ends (every replica drops its rows under the
    -- old name) and a new one begins, whose rows are all sent again.
    IF previous.id IS NOT NULL
       AND (previous.table_name <> table_name OR previous.key_columns <> keys
            OR previous.key_types IS DISTINCT FROM sync_internal.column_types("table", keys)
            OR previous.key_definitions <> sync_internal.key_definitions("table", keys)) THEN
        PERFORM sync.end_codec(previous.id);
    END IF;
    INSERT INTO sync.codec AS c (relation, table_name, kind, "to", audience, to_column, replica_column,
                                 columns, replica_columns, stamp, key_columns, key_types,
                                 key_definitions, shape)
    VALUES (relation, table_name, kind, "to", audience, to_column, replica_column,
            columns, replica_columns, stamp, keys, sync_internal.column_types("table", keys),
            sync_internal.key_definitions("table", keys), sync_internal.table_shape("table"))
    ON CONFLICT ON CONSTRAINT codec_relation_key DO UPDATE
        SET table_name = excluded.table_name, kind = excluded.kind, "to" = excluded."to",
            audience = excluded.audience, to_column = excluded.to_column,
            replica_column = excluded.replica_column, columns = excluded.columns,
            replica_columns = excluded.replica_columns, stamp = excluded.stamp,
            key_columns = excluded.key_columns, key_types = excluded.key_types,
            key_definitions = excluded.key_definitions, shape = excluded.shape
    RETURNING c.id INTO codec_id;
    PERFORM sync_internal.install_capture(relation, codec_id, keys);
    PERFORM sync_internal.declared(codec_id, groups_before);
END
$$;

-- The server's rows, sent down; an upload of one is refused.
CREATE FUNCTION sync.catalog("table" regclass, "to" text DEFAULT 'all', columns name[] DEFAULT NULL)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT sync_internal.codec("table", 'catalog', "to", columns) $$;

-- Facts a replica creates, filed insert-if-absent by primary key. Up only unless `to`.
CREATE FUNCTION sync.record("table" regclass, "to" text DEFAULT NULL, columns name[] DEFAULT NULL,
                            stamp name[] DEFAULT '{}') RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT sync_internal.codec("table", 'record', "to", columns, '{}', stamp) $$;

-- Rows both sides write: down whole, up only the replica_columns.
CREATE FUNCTION sync.both("table" regclass, "to" text DEFAULT NULL, replica_columns name[] DEFAULT '{}',
                          columns name[] DEFAULT NULL, stamp name[] DEFAULT '{}') RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT sync_internal.codec("table", 'both', "to", columns, replica_columns, stamp) $$;

-- Ends a codec: its declaration goes, and the next pass forgets its rows, its notes and what was
-- set aside of it, and has every replica that holds some drop the table (sync.dropped_codec). It
-- touches no row the relay locks (a note the pass is taking, say): in a transaction that also
-- altered the table, that would deadlock with a pass waiting to read it.
CREATE FUNCTION sync.end_codec(codec int) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    groups_before name[] := sync_internal.group_columns();
BEGIN
    INSERT INTO sync.dropped_codec (codec, table_name)
    SELECT c.id, c.table_name FROM sync.codec c WHERE c.id = end_codec.codec
    ON CONFLICT DO NOTHING;
    DELETE FROM sync.codec c WHERE c.id = end_codec.codec;
    PERFORM sync_internal.declared(NULL, groups_before);
END
$$;

-- Stops syncing a table: its declaration, capture triggers and pending notes go, and every
-- replica drops its rows.
CREATE FUNCTION sync.drop("table" regclass) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    codec_id int := (SELECT c.id FROM sync.codec c WHERE c.relation = "table");
BEGIN
    IF codec_id IS NULL THEN
        RAISE EXCEPTION 'table % does not sync: it has no codec', sync_internal.relation_name("table")
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT table_name FROM sync.codec lists the tables that sync.';
    END IF;
    PERFORM sync_internal.remove_capture("table");
    PERFORM sync.end_codec(codec_id);
END
$$;

-- Says what the server knows of a replica that sends something up (known(uuid) → jsonb, NULL:
-- unknown) and what each filing sets up first (filing(jsonb)). NULL: the default, Anyone.
CREATE FUNCTION sync.senders(known regprocedure DEFAULT NULL, filing regprocedure DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    known_proc pg_proc;
    filing_proc pg_proc;
BEGIN
    SELECT * INTO known_proc FROM pg_proc WHERE oid = known;
    IF known IS NOT NULL AND (known_proc.pronargs <> 1 OR known_proc.proargtypes[0] <> 'uuid'::regtype
                              OR known_proc.prorettype <> 'jsonb'::regtype OR known_proc.proretset) THEN
        RAISE EXCEPTION 'known must be a function (uuid) returning jsonb, but % returns %',
                        known, known_proc.prorettype::regtype
            USING ERRCODE = 'invalid_function_definition',
                  HINT = 'known(replica uuid) says what the server knows of a replica that '
                         'sends something up, as jsonb; NULL means it is unknown.';
    END IF;
    SELECT * INTO filing_proc FROM pg_proc WHERE oid = filing;
    IF filing IS NOT NULL AND (filing_proc.pronargs <> 1 OR filing_proc.proargtypes[0] <> 'jsonb'::regtype
                               OR filing_proc.proretset) THEN
        RAISE EXCEPTION 'filing must be a function (jsonb), but % is not', filing
            USING ERRCODE = 'invalid_function_definition',
                  HINT = 'filing(known jsonb) runs first in each filing, with what known() '
                         'returned, to set what row policies read (set_config(..., true)).';
    END IF;
    INSERT INTO sync.sender_rule AS s (known, filing) VALUES (known, filing)
    ON CONFLICT (singleton) DO UPDATE SET known = excluded.known, filing = excluded.filing;
END
$$;

-- What is wrong with the replicas' declaration now, one row each, and how to fix it. `refuses`: a
-- schema change that causes it is refused (sync_internal.on_ddl), since nothing could sync meanwhile.
CREATE FUNCTION sync_internal.replica_set_problems()
RETURNS TABLE (problem text, fix text, refuses boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r sync.replica_set;
    current_name text;
BEGIN
    SELECT * INTO r FROM sync.replica_set;
    IF r.relation IS NULL THEN
        RETURN;
    END IF;
    current_name := sync_internal.relation_name(r.relation);
    IF current_name IS NULL THEN
        RETURN QUERY SELECT format('relation %s was dropped', r.relation_name),
                            'Create it again and redeclare it with sync.replicas().', false;
        RETURN;
    END IF;
    IF current_name <> r.relation_name THEN
        RETURN QUERY SELECT format('relation %s was renamed to %s', r.relation_name, current_name),
                            format('Redeclare it: SELECT sync.replicas(%L, %L, %L).', current_name,
                                   r.name, r.live), false;
    END IF;
    IF sync_internal.column_type(r.relation, 'id') IS DISTINCT FROM 'uuid'::regtype THEN
        RETURN QUERY SELECT format('%s has no column "id" of type uuid any more', current_name),
                            'Add it back: every replica is identified by an id uuid.', true;
    END IF;
    IF r.partitioned_by IS NOT NULL AND sync_internal.column_type(r.relation, r.partitioned_by) IS NULL THEN
        RETURN QUERY SELECT format('%s has no column "%s" (partitioned_by) any more', current_name,
                                   r.partitioned_by),
                            'Add it back, or redeclare the replicas without partitioned_by.', true;
    END IF;
    BEGIN
        PERFORM sync_internal.require_live(r.relation, r.live);
    EXCEPTION WHEN OTHERS THEN
        RETURN QUERY SELECT SQLERRM, 'Redeclare the replicas with a live expression that holds now.', true;
    END;
END
$$;

-- The first column of `relation` among those that travel (`columns`; NULL: all) whose type is json
-- (not jsonb), as its problem and fix. json keeps its text as written (spaces, key order, repeated
-- keys) and a message, JSON itself, cannot carry that text exactly: docs/PROTOCOL.md, the types.
CREATE FUNCTION sync_internal.json_column_problem(relation regclass, columns name[])
RETURNS TABLE (problem text, fix text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('column "%s" of %s is of type %s, which keeps its text as written (spaces, key '
                  'order, repeated keys): no message can carry it exactly',
                  a.attname, sync_internal.relation_name(relation), a.atttypid::regtype),
           format('Make it jsonb (ALTER TABLE %1$s ALTER COLUMN %2$I TYPE jsonb), or text, or leave '
                  'it out of the columns declared.', sync_internal.relation_name(relation), a.attname)
    FROM pg_attribute a
    WHERE a.attrelid = relation AND a.attnum > 0 AND NOT a.attisdropped
      AND (columns IS NULL OR a.attname = ANY (columns))
      AND (SELECT coalesce(nullif(t.typbasetype, 0), t.oid) FROM pg_type t WHERE t.oid = a.atttypid)
          IN ('json'::regtype, 'json[]'::regtype)
    ORDER BY a.attnum LIMIT 1
$$;

-- What is wrong with a codec's declaration now, one row each, and how to fix it (`refuses`: as for
-- sync_internal.replica_set_problems; `in_replicas`: the problem lies in the replicas relation).
CREATE FUNCTION sync_internal.codec_problems(c sync.codec)
RETURNS TABLE (problem text, fix text, refuses boolean, in_replicas boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r sync.replica_set;
    current_name text := sync_internal.relation_name(c.relation);
    wanted name;
    lost name[];
    own_type regtype;
BEGIN
    SELECT * INTO r FROM sync.replica_set;
    IF current_name IS NULL THEN
        RETURN QUERY SELECT format('table %s was dropped', c.table_name),
                            format('Create the table again and redeclare it, or stop syncing it (every '
                                   'replica drops its rows): SELECT sync.end_codec(%s).', c.id), false, false;
        RETURN;
    END IF;
    IF current_name <> c.table_name THEN
        RETURN QUERY SELECT format('table %s was renamed to %s; replicas know it by its old name',
                                   c.table_name, current_name),
                            format('Redeclare it: SELECT sync.%s(%L, ...) with its new name.', c.kind,
                                   current_name), false, false;
    END IF;
    SELECT array_agg(x) INTO lost
    FROM unnest(c.key_columns || coalesce(c.columns, '{}') || c.replica_columns || c.stamp
                || array_remove(ARRAY[c.to_column], NULL)) x
    WHERE sync_internal.column_type(c.relation, x) IS NULL;
    FOREACH wanted IN ARRAY coalesce(lost, '{}') LOOP
        RETURN QUERY SELECT format('column "%s" of %s, named in its declaration, was dropped', wanted,
                                   current_name),
                            format('Add the column back, or redeclare %s without it.', current_name), true, false;
    END LOOP;
    IF c.replica_column IS NOT NULL AND r.relation IS NOT NULL
       AND sync_internal.column_type(r.relation, c.replica_column) IS NULL THEN
        RETURN QUERY SELECT format('to => %L matches column "%s" of the replicas, which %s no longer has',
                                   c."to", c.replica_column, r.relation_name),
                            format('Add the column back, or redeclare %s with another "to".', current_name),
                            true, true;
    END IF;
    own_type := sync_internal.column_type(c.relation, c.to_column);
    IF c.audience = 'own' AND own_type <> 'uuid'::regtype
       OR c.audience = 'group' AND r.relation IS NOT NULL
          AND own_type <> sync_internal.column_type(r.relation, c.replica_column) THEN
        RETURN QUERY SELECT format('to => %L: column %s.%s is of type %s now', c."to", current_name,
                                   c.to_column, own_type),
                            format('Change it back, or redeclare %s with another "to".', current_name),
                            true, true;
    END IF;
    IF sync_internal.key_columns(c.relation) IS DISTINCT FROM c.key_columns THEN
        RETURN QUERY SELECT format('the primary key of %s changed from (%s) to (%s)', current_name,
                                   array_to_string(c.key_columns, ', '),
                                   coalesce(array_to_string(sync_internal.key_columns(c.relation), ', '), 'none')),
                            format('Redeclare %s so its rows are keyed by the new primary key.', current_name),
                            true, false;
    ELSIF sync_internal.column_types(c.relation, c.key_columns) IS DISTINCT FROM c.key_types THEN
        RETURN QUERY SELECT format('the type of the key of %s changed from (%s) to (%s)', current_name,
                                   array_to_string(c.key_types, ', '),
                                   array_to_string(sync_internal.column_types(c.relation, c.key_columns), ', ')),
                            format('Redeclare %s: its rows have other keys now.', current_name), false, false;
    END IF;
    IF NOT sync_internal.capture_installed(c.relation) THEN
        RETURN QUERY SELECT format('the capture triggers of %s are missing', current_name),
                            format('Redeclare %s: its changes are not being noted.', current_name), false, false;
    END IF;
    RETURN QUERY SELECT j.problem, j.fix, true, false
                 FROM sync_internal.json_column_problem(c.relation, c.columns) j;
END
$$;

-- Runs the senders' hooks as `role` the way sync.receive does (known(replica), then filing() with
-- what known() returned), after running `grants`, in a subtransaction that is always rolled
-- back: nothing the hooks or the grants did stays (but for what no rollback undoes, such as a
-- sequence's nextval). filing() runs with '{}' when known() returns NULL, where receive would
-- drop the upload, so that what it needs is still found. `hook`: where it stopped ('grant',
-- 'role', 'known' or 'filing') with the error's SQLSTATE and message, or NULL when the hooks ran
-- to their end. The caller's own role comes back with the rollback. The hooks run in the
-- caller's session under SET ROLE, as the relay's retry runs them.
CREATE FUNCTION sync_internal.run_hooks_as(role name, grants text[], replica uuid,
                                           OUT hook text, OUT state text, OUT message text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    known_call text;
    filing_call text;
    grant_statement text;
    known_value jsonb := '{}';
    ran boolean := false;
BEGIN
    -- The hooks named as sync_internal.receive_setup names them for sync.receive.
    SELECT (SELECT format('%I.%I', n.nspname, p.proname) FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = s.known),
           (SELECT format('%I.%I', n.nspname, p.proname) FROM pg_proc p
            JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = s.filing)
    INTO known_call, filing_call
    FROM sync.sender_rule s;
    BEGIN
        hook := 'grant';
        FOREACH grant_statement IN ARRAY grants LOOP
            EXECUTE grant_statement;
        END LOOP;
        hook := 'role';
        -- the messages as sync_internal.hook_grant_needs reads them
        PERFORM set_config('lc_messages', 'C', true);
        PERFORM set_config('role', run_hooks_as.role, true);
        IF known_call IS NOT NULL THEN
            hook := 'known';
            EXECUTE format('SELECT %s($1::uuid)', known_call) INTO known_value USING replica;
        END IF;
        IF filing_call IS NOT NULL THEN
            hook := 'filing';
            EXECUTE format('SELECT %s($1::jsonb)', filing_call) USING coalesce(known_value, '{}');
        END IF;
        ran := true;
        RAISE EXCEPTION 'rolled back';
    EXCEPTION WHEN OTHERS THEN
        IF ran THEN
            hook := NULL;
        ELSE
            state := SQLSTATE;
            message := SQLERRM;
        END IF;
    END;
END
$$;

-- Whether granting `privileges` on `target` (as a GRANT names it: "app.sites", "SEQUENCE
-- app.ids", "SCHEMA app", "FUNCTION app.f(int)") to `role`, besides `grants`, gets the hooks past
-- the error they stopped at (`hook`, `message`): they run to their end or stop somewhere else.
CREATE FUNCTION sync_internal.hook_grant_cures(role name, grants text[], replica uuid, target text,
                                               privileges text[], hook text, message text)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (r.hook, r.message) IS DISTINCT FROM (hook_grant_cures.hook, hook_grant_cures.message)
    FROM sync_internal.run_hooks_as(hook_grant_cures.role,
             hook_grant_cures.grants || format('GRANT %s ON %s TO %I', array_to_string(privileges, ', '),
                                               target, hook_grant_cures.role),
             hook_grant_cures.replica) r
$$;

-- What `role` lacks to run the senders' hooks that are not SECURITY DEFINER, found by running them
-- as the role (sync_internal.run_hooks_as) for `replica`, after `grants` (what it is known to lack
-- already: USAGE on a hook's schema, EXECUTE on a hook). Each "permission denied for <object>"
-- they stop at names the object; the privileges on it that cure it are found by running them
-- again with privileges granted (rolled back too): the first one that cures it alone, else those
-- of all its privileges that, left out, bring the error back. Then the hooks run again with it
-- granted, up to the next error. The messages are read as PostgreSQL writes them in English
-- (run_hooks_as runs with lc_messages C). An error no grant cures, or an object the message does
-- not name unambiguously, is said as it is, and what the hooks need past it is not known: they
-- are not run further. Only a superuser may become any role and grant anything, and a read-only
-- transaction (a standby) can grant nothing and file nothing: there the hooks are not run, and
-- that is said.
CREATE FUNCTION sync_internal.hook_grant_needs(role name, grants text[], replica uuid)
RETURNS TABLE (hook text, problem text, fix text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    run record;
    object_kind text;
    object_name text;
    target text;
    privileges text[];
    needed text[];
    privilege text;
BEGIN
    IF NOT EXISTS (SELECT FROM sync.sender_rule s JOIN pg_proc p ON p.oid IN (s.known, s.filing)
                   WHERE NOT p.prosecdef) THEN
        RETURN;  -- nothing runs as the role but EXECUTE
    END IF;
    IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user), false)
       OR current_setting('transaction_read_only')::boolean THEN
        hook := (SELECT CASE WHEN known.prosecdef IS NOT DISTINCT FROM false THEN 'known' ELSE 'filing' END
                 FROM sync.sender_rule s LEFT JOIN pg_proc known ON known.oid = s.known);
        problem := format('what role %s needs to run known() and filing() is not known: sync.check() '
                          'finds it by running them as that role, which only a superuser''s call in a '
                          'read-write transaction does', role);
        fix := 'Call sync.check() as a superuser, in a read-write transaction.';
        RETURN NEXT;
        RETURN;
    END IF;
    FOR attempt IN 1..50 LOOP
        SELECT * INTO run FROM sync_internal.run_hooks_as(role, grants, replica);
        EXIT WHEN run.hook IS NULL;
        hook := run.hook;
        IF run.hook IN ('grant', 'role') THEN
            hook := (SELECT CASE WHEN s.known IS NOT NULL THEN 'known' ELSE 'filing' END
                     FROM sync.sender_rule s);
            problem := format('what role %s needs to run known() and filing() is not known: running them as '
                              'that role failed (%s)', role, run.message);
            fix := 'Call sync.check() as a superuser, outside a SECURITY DEFINER function and a '
                   'read-only transaction.';
            RETURN NEXT;
            RETURN;
        END IF;
        object_kind := NULL;
        object_name := NULL;
        target := NULL;
        IF run.state = '42501' THEN
            object_kind := substring(run.message FROM '^permission denied for (table|view|materialized view'
                                                      '|foreign table|sequence|schema|function|procedure) ');
            object_name := substring(run.message FROM '^permission denied for (?:table|view|materialized view'
                                                      '|foreign table|sequence|schema|function|procedure) (.*)$');
        END IF;
        privileges := CASE object_kind
                          WHEN 'sequence' THEN ARRAY['USAGE', 'SELECT', 'UPDATE']
                          WHEN 'schema' THEN ARRAY['USAGE']
                          WHEN 'function' THEN ARRAY['EXECUTE']
                          WHEN 'procedure' THEN ARRAY['EXECUTE']
                          ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES',
                                     'TRIGGER'] END;
        -- The message names the object without its schema: the one of that name the role lacks
        -- something on, when there is one.
        IF object_kind = 'schema' THEN
            target := (SELECT format('SCHEMA %I', n.nspname) FROM pg_namespace n WHERE n.nspname = object_name);
        ELSIF object_kind IN ('function', 'procedure') THEN
            target := (SELECT CASE WHEN count(*) = 1
                                   THEN min(format('%s %s', upper(object_kind), p.oid::regprocedure)) END
                       FROM pg_proc p
                       WHERE p.proname = object_name AND NOT has_function_privilege(role, p.oid, 'EXECUTE'));
        ELSIF object_kind IS NOT NULL THEN
            target := (SELECT CASE WHEN count(*) = 1
                                   THEN min(CASE WHEN c.relkind = 'S' THEN 'SEQUENCE ' ELSE '' END
                                            || c.oid::regclass::text) END
                       FROM pg_class c
                       WHERE c.relname = object_name
                         AND c.relkind = ANY (CASE object_kind WHEN 'table' THEN ARRAY['r', 'p']
                                                               WHEN 'view' THEN ARRAY['v']
                                                               WHEN 'materialized view' THEN ARRAY['m']
                                                               WHEN 'foreign table' THEN ARRAY['f']
                                                               ELSE ARRAY['S'] END::"char"[])
                         AND EXISTS (SELECT FROM unnest(privileges) q
                                     WHERE NOT CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(role, c.oid, q)
                                                    ELSE has_table_privilege(role, c.oid, q) END));
        END IF;
        needed := NULL;
        IF target IS NOT NULL THEN
            FOREACH privilege IN ARRAY privileges LOOP
                IF sync_internal.hook_grant_cures(role, grants, replica, target, ARRAY[privilege],
                                                  run.hook, run.message) THEN
                    needed := ARRAY[privilege];
                    EXIT;
                END IF;
            END LOOP;
            IF needed IS NULL AND cardinality(privileges) > 1
               AND sync_internal.hook_grant_cures(role, grants, replica, target, privileges, run.hook,
                                                  run.message) THEN
                needed := ARRAY(SELECT q FROM unnest(privileges) WITH ORDINALITY AS u(q, o)
                                WHERE NOT sync_internal.hook_grant_cures(role, grants, replica, target,
                                                                         array_remove(privileges, q),
                                                                         run.hook, run.message)
                                ORDER BY o);
                IF NOT sync_internal.hook_grant_cures(role, grants, replica, target, needed, run.hook,
                                                      run.message) THEN
                    needed := privileges;
                END IF;
            END IF;
        END IF;
        IF needed IS NULL THEN
            problem := format('running %s() as role %s for replica %s fails (%s)%s: what it needs past that '
                              'is not known', run.hook, role, replica, run.message,
                              CASE WHEN run.state = '42501'
                                   THEN ', and no grant on an object it names cures it' ELSE '' END);
            fix := CASE WHEN run.state = '42501'
                        THEN format('Give role %s what that needs, then check again.', role)
                        ELSE format('Make %s() run for that replica as that role, then check again.', run.hook) END;
            RETURN NEXT;
            RETURN;
        END IF;
        problem := format('role %s, which files uploads, lacks %s on %s, which running %s() as that role '
                          'needs: every upload it files fails (%s)', role, array_to_string(needed, ', '),
                          regexp_replace(target, '^(SEQUENCE|FUNCTION|PROCEDURE) ', ''), run.hook, run.message);
        fix := format('GRANT %s ON %s TO %I;', array_to_string(needed, ', '), target, role);
        RETURN NEXT;
        grants := grants || fix;
    END LOOP;
END
$$;

-- The privileges filing needs that a role which files uploads lacks: the route's roles (members
-- of sync_receiver), or magic_sync.role when it is set. Per table: a record row is inserted if
-- absent (INSERT ... ON CONFLICT (key) DO NOTHING: INSERT, and SELECT on the key); a both row is
-- inserted or its replica_columns changed (also UPDATE on those, and SELECT on them and on the
-- columns that say whose it is: its "to" column and the partition column). Per hook of
-- sync.senders (sync.receive calls it by its qualified name, as the role): USAGE on its schema,
-- EXECUTE on it, and, unless it is SECURITY DEFINER, what its body needs as the role, found by
-- running the hooks (sync_internal.hook_grant_needs, for the first live replica). VOLATILE: it
-- runs the hooks, and grants while it does, all rolled back.
CREATE FUNCTION sync_internal.filing_grant_problems()
RETURNS TABLE (declaration text, problem text, fix text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH filers AS (
        SELECT r.oid, r.rolname FROM pg_roles r
        WHERE r.rolname = nullif(sync.setting('role'), '')
        UNION
        SELECT r.oid, r.rolname FROM pg_roles r
        WHERE nullif(sync.setting('role'), '') IS NULL AND NOT r.rolsuper
          AND r.rolname <> 'sync_receiver' AND pg_has_role(r.oid, 'sync_receiver', 'MEMBER')),
    needs AS (
        SELECT c.kind, c.table_name, c.relation, n.privilege, n.columns
        FROM sync.codec c
        CROSS JOIN LATERAL (VALUES ('INSERT', NULL::name[]), ('SELECT', c.key_columns),
                                   ('SELECT', CASE WHEN c.kind = 'both' THEN c.replica_columns END),
                                   -- a both row is changed only when it is the replica's
                                   ('SELECT', CASE WHEN c.kind = 'both' THEN array_remove(ARRAY[
                                       c.to_column, (SELECT s.partitioned_by FROM sync.replica_set s)],
                                       NULL) END),
                                   ('UPDATE', CASE WHEN c.kind = 'both' THEN c.replica_columns END),
                                   -- what a both row cannot be without and the replica may not
                                   -- write is read from the stored row
                                   ('SELECT', CASE WHEN c.kind = 'both' THEN ARRAY(
                                       SELECT col FROM unnest(sync_internal.required_columns(c.relation)) col
                                       WHERE col <> ALL (c.key_columns || c.replica_columns || c.stamp)) END))
                           AS n(privilege, columns)
        WHERE c.kind IN ('record', 'both') AND (n.privilege = 'INSERT' OR n.columns IS NOT NULL)),
    missing AS (
        SELECT n.kind, n.table_name, f.rolname, n.privilege,
               (SELECT array_agg(col ORDER BY o) FROM unnest(n.columns) WITH ORDINALITY AS u(col, o)
                WHERE NOT has_column_privilege(f.oid, n.relation, col, n.privilege)) AS columns
        FROM needs n CROSS JOIN filers f
        WHERE CASE WHEN n.columns IS NULL THEN NOT has_table_privilege(f.oid, n.relation, n.privilege)
                   ELSE EXISTS (SELECT FROM unnest(n.columns) col
                                WHERE NOT has_column_privilege(f.oid, n.relation, col, n.privilege)) END),
    -- the senders' hooks
    hooks AS (
        SELECT h.ord, h.hook, p.oid, n.oid AS schema, n.nspname,
               format('%s %s', h.hook, p.oid::regprocedure) AS declaration
        FROM sync.sender_rule s
        CROSS JOIN LATERAL (VALUES (1, 'known', s.known), (2, 'filing', s.filing)) AS h(ord, hook, proc)
        JOIN pg_proc p ON p.oid = h.proc
        JOIN pg_namespace n ON n.oid = p.pronamespace),
    hook_missing AS (
        -- a schema the two hooks share is named once, for the first
        (SELECT DISTINCT ON (f.rolname, h.schema) h.ord, h.declaration, f.rolname, 0 AS step,
                format('role %s, which files uploads, lacks USAGE on schema %s: every upload it files fails',
                       f.rolname, h.nspname) AS problem,
                format('GRANT USAGE ON SCHEMA %I TO %I;', h.nspname, f.rolname) AS fix
         FROM hooks h CROSS JOIN filers f
         WHERE NOT has_schema_privilege(f.oid, h.schema, 'USAGE')
         ORDER BY f.rolname, h.schema, h.ord)
        UNION ALL
        SELECT h.ord, h.declaration, f.rolname, 1,
               format('role %s, which files uploads, lacks EXECUTE on it: every upload it files fails',
                      f.rolname),
               format('GRANT EXECUTE ON FUNCTION %s TO %I;', h.oid::regprocedure, f.rolname)
        FROM hooks h CROSS JOIN filers f
        WHERE NOT has_function_privilege(f.oid, h.oid, 'EXECUTE'))
    SELECT declaration, problem, fix FROM (
        SELECT format('%s %s', m.kind, m.table_name) AS declaration,
               format('role %s, which files uploads, lacks %s%s on it: every row it files there is kept',
                      m.rolname, m.privilege,
                      coalesce(' (' || array_to_string(m.columns, ', ') || ')', '')) AS problem,
               format('GRANT %s%s ON %s TO %I;', m.privilege,
                      coalesce(' (' || (SELECT string_agg(quote_ident(col), ', ') FROM unnest(m.columns) col) || ')', ''),
                      m.table_name, m.rolname) AS fix,
               m.table_name, m.rolname, 1 AS step, m.privilege, 0 AS part, 0 AS hook
        FROM missing m
        UNION ALL
        -- the table is reached through its schema
        SELECT format('%s %s', c.kind, c.table_name),
               format('role %s, which files uploads, lacks USAGE on schema %s: every row it files there is kept',
                      f.rolname, n.nspname),
               format('GRANT USAGE ON SCHEMA %I TO %I;', n.nspname, f.rolname),
               c.table_name, f.rolname, 0, 'USAGE', 0, 0
        FROM sync.codec c
        JOIN pg_class t ON t.oid = c.relation
        JOIN pg_namespace n ON n.oid = t.relnamespace
        CROSS JOIN filers f
        WHERE c.kind IN ('record', 'both') AND NOT has_schema_privilege(f.oid, n.oid, 'USAGE')
        UNION ALL
        SELECT h.declaration, h.problem, h.fix, NULL, h.rolname, h.step, NULL, 1, h.ord
        FROM hook_missing h
        UNION ALL
        SELECT h.declaration, n.problem, n.fix, NULL, f.rolname, 1 + n.found, NULL, 1, h.ord
        FROM filers f
        CROSS JOIN LATERAL sync_internal.hook_grant_needs(
            f.rolname, ARRAY(SELECT m.fix FROM hook_missing m WHERE m.rolname = f.rolname ORDER BY m.ord, m.step),
            coalesce((SELECT r.id FROM sync.replica r WHERE r.live ORDER BY r.id LIMIT 1),
                     '00000000-0000-0000-0000-000000000000')) WITH ORDINALITY AS n(hook, problem, fix, found)
        JOIN hooks h ON h.hook = n.hook) p
    ORDER BY part, table_name, hook, rolname, step, privilege
$$;

-- One row per problem with the declarations, saying what is wrong and how to fix it: tables
-- dropped or renamed, columns dropped, triggers gone, grants filing lacks. VOLATILE: see
-- sync_internal.filing_grant_problems.
CREATE FUNCTION sync.check()
RETURNS TABLE (declaration text, problem text, fix text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('replicas %s (%s)', r.name, r.relation_name), p.problem, p.fix
    FROM sync.replica_set r, sync_internal.replica_set_problems() p
    UNION ALL
    (SELECT format('%s %s', c.kind, c.table_name), p.problem, p.fix
     FROM sync.codec c, sync_internal.codec_problems(c) p
     ORDER BY c.table_name)
    UNION ALL
    SELECT * FROM sync_internal.filing_grant_problems()
$$;

-- What is declared, for psql: the replicas relation first, then one row per synced table with
-- who receives its rows (read from the rule as parsed, sync.codec's audience), the columns that
-- travel (all of the table's when none were named), those a replica may write, the stamps, the key.
CREATE VIEW sync.declarations AS
SELECT r.relation_name AS "table", 'replicas' AS kind, NULL::text AS "to",
       format('%s; live when %s', r.name, r.live)
       || CASE WHEN r.partitioned_by IS NOT NULL
               THEN format('; partitioned by %I', r.partitioned_by) ELSE '' END AS audience,
       NULL::name[] AS columns, NULL::name[] AS replica_columns, NULL::name[] AS stamp,
       ARRAY['id']::name[] AS key_columns
FROM sync.replica_set r
UNION ALL
(SELECT c.table_name, c.kind, c."to",
        CASE c.audience
            WHEN 'nobody' THEN 'no replica (up only)'
            WHEN 'all' THEN 'every replica'
            WHEN 'own' THEN format('the replica whose id is in %I', c.to_column)
            WHEN 'group' THEN format('every replica whose %I equals the row''s %I',
                                     c.replica_column, c.to_column)
        END
        || coalesce((SELECT format(' (same %I as the row)', s.partitioned_by) FROM sync.replica_set s
                     WHERE s.partitioned_by IS NOT NULL AND c.audience <> 'nobody'), ''),
        coalesce(c.columns, ARRAY(SELECT a.attname FROM pg_attribute a
                                  WHERE a.attrelid = c.relation AND a.attnum > 0
                                    AND NOT a.attisdropped ORDER BY a.attnum)),
        c.replica_columns, c.stamp, c.key_columns
 FROM sync.codec c
 ORDER BY c.table_name);

-- Schema changes (docs/DESIGN.md §13). After an ALTER TABLE of a synced table: a change that would break
-- its declaration is refused, saying why and what to do first; a change of its key's type re-keys
-- it (declared again: every replica drops the rows under the old keys and gets them again); any
-- other change of its columns plans the whole table again, so rows that were not changed since
-- travel in their new shape (only those whose canonical form changed). After an ALTER TABLE of the
-- replicas relation: the same refusals, and every replica is looked at again (its groups, its
-- liveness may have changed). After an ALTER TYPE (an enum's value renamed, a composite's
-- attribute added), or an ALTER TABLE of a table whose row type a column holds: every table
-- whose columns' types it changed, however deep (sync_internal.table_shape), as for a change of
-- its columns. SECURITY DEFINER: it runs for whoever alters a table or a type.
CREATE FUNCTION sync_internal.on_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    altered oid[];
    c sync.codec;
    broken record;
    replicas regclass := (SELECT s.relation FROM sync.replica_set s);
BEGIN
    SELECT coalesce(array_agg(d.objid), '{}') INTO altered FROM pg_event_trigger_ddl_commands() d
    WHERE d.classid = 'pg_class'::regclass;
    IF replicas = ANY (altered) THEN
        SELECT * INTO broken FROM sync_internal.replica_set_problems() p WHERE p.refuses LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'this change of % breaks its declaration as the replicas: %',
                            sync_internal.relation_name(replicas), broken.problem
                USING ERRCODE = 'dependent_objects_still_exist', HINT = broken.fix;
        END IF;
        FOR c IN SELECT * FROM sync.codec x WHERE x.replica_column IS NOT NULL LOOP
            -- What this change of the replicas relation breaks: not the other problems the table
            -- may have now (in the middle of a restore, its primary key not made yet).
            SELECT * INTO broken FROM sync_internal.codec_problems(c) p
            WHERE p.refuses AND p.in_replicas LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'this change of % breaks the declaration of %: %',
                                sync_internal.relation_name(replicas), c.table_name, broken.problem
                    USING ERRCODE = 'dependent_objects_still_exist', HINT = broken.fix;
            END IF;
        END LOOP;
        INSERT INTO sync.note (codec, key) VALUES (0, NULL);
        PERFORM sync_internal.wake();
    END IF;
    -- A table altered, or one whose columns' types were (ALTER TYPE, or ALTER TABLE of a table
    -- whose row type a column holds). Not one without its capture triggers: pg_restore makes them
    -- last, and alters a table before its primary key is made (a NOT VALID check).
    FOR c IN SELECT * FROM sync.codec x
             WHERE (x.relation = ANY (altered) OR sync_internal.table_shape(x.relation) <> x.shape)
               AND sync_internal.capture_installed(x.relation)
    LOOP
        SELECT * INTO broken FROM sync_internal.codec_problems(c) p WHERE p.refuses LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'this change of % breaks its sync declaration: %', c.table_name,
                            broken.problem
                USING ERRCODE = 'dependent_objects_still_exist',
                      HINT = broken.fix || format(' Or stop syncing it first: SELECT sync.drop(%L).',
                                                  sync_internal.relation_name(c.relation));
        END IF;
        IF sync_internal.column_types(c.relation, c.key_columns) IS DISTINCT FROM c.key_types
           OR c.key_definitions <> sync_internal.key_definitions(c.relation, c.key_columns) THEN
            PERFORM sync_internal.codec(c.relation, c.kind, c."to", c.columns, c.replica_columns, c.stamp);
        ELSIF sync_internal.table_shape(c.relation) <> c.shape THEN
            UPDATE sync.codec x SET shape = sync_internal.table_shape(c.relation) WHERE x.id = c.id;
            INSERT INTO sync.note (codec, key) VALUES (c.id, NULL);
            PERFORM sync_internal.wake();
        END IF;
    END LOOP;
END
$$;

-- After a DROP of a synced table: it stops syncing, as with sync.drop(), and every replica drops
-- its rows.
CREATE FUNCTION sync_internal.on_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sync.end_codec(c.id) FROM sync.codec c
    JOIN pg_event_trigger_dropped_objects() d
      ON d.classid = 'pg_class'::regclass AND d.objid = c.relation AND d.objsubid = 0;
END
$$;

CREATE EVENT TRIGGER magic_sync_ddl ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'ALTER TYPE')
EXECUTE FUNCTION sync_internal.on_ddl();
CREATE EVENT TRIGGER magic_sync_drop ON sql_drop WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
EXECUTE FUNCTION sync_internal.on_drop();

-- The routing rule of a codec as SQL, its one owner: a boolean expression that is true when the
-- row aliased `row_alias` (a row of the codec's table) is in the audience of the replica aliased
-- `replica_alias` (a row of the replicas relation), partition included. Built from the rule as
-- parsed at declaration (sync.codec.audience, to_column, replica_column); the aliases are quoted.
CREATE FUNCTION sync.audience_sql(codec int, row_alias text, replica_alias text) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '(' || CASE c.audience
                      WHEN 'all' THEN 'true'
                      WHEN 'own' THEN format('%I.%I = %I.id', row_alias, c.to_column, replica_alias)
                      WHEN 'group' THEN format('%I.%I = %I.%I', row_alias, c.to_column,
                                               replica_alias, c.replica_column)
                      ELSE 'false' END
           || CASE WHEN s.partitioned_by IS NULL THEN ''
                   ELSE format(' AND %I.%I IS NOT DISTINCT FROM %I.%I', row_alias, s.partitioned_by,
                               replica_alias, s.partitioned_by) END
           || ')'
    FROM sync.codec c LEFT JOIN sync.replica_set s ON true
    WHERE c.id = audience_sql.codec
$$;
