-- The simulation's stand-in for sync.expected(replica) (issue 19 item 1) while this branch has
-- no oracle of its own: what a replica must hold, from the declarations and the user tables
-- alone, by the declared rules (all, own, group, partition, live). It reads no relay state
-- (sync.row, sync.scope, sync.member, sync.chunk, the outbox). Installed by the simulation only
-- when sync.expected is missing; remove it once the product's oracle is merged.
CREATE SCHEMA sim_oracle;
CREATE FUNCTION sim_oracle.expected(replica uuid)
RETURNS TABLE (table_name text, key text, "row" text, h text, scope text, withheld boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    rs sync.replica_set;
    c sync.codec;
    me jsonb;
    is_live boolean;
    part text := '';
    rule text[];
    hidden text[];
    audience text;
    scope_expr text;
    limit_bytes int := (SELECT setting::int FROM pg_settings WHERE name = 'magic_sync.bytes_per_message')
                       - sync.envelope_size('{*}', '{}') - 2;
BEGIN
    SELECT * INTO rs FROM sync.replica_set;
    IF rs.relation IS NULL THEN RETURN; END IF;
    EXECUTE format('SELECT to_jsonb(r), (%s) FROM %s r WHERE r.id = $1', rs.live, rs.relation)
        INTO me, is_live USING replica;
    IF me IS NULL OR NOT coalesce(is_live, false) THEN RETURN; END IF;
    IF rs.partitioned_by IS NOT NULL THEN part := me->>rs.partitioned_by; END IF;
    FOR c IN SELECT * FROM sync.codec co WHERE sync.relation_name(co.relation) IS NOT NULL LOOP
        CONTINUE WHEN c."to" IS NULL;
        hidden := coalesce((SELECT array_agg(a.attname::text) FROM pg_attribute a
                            WHERE a.attrelid = c.relation AND a.attnum > 0 AND NOT a.attisdropped
                              AND c.columns IS NOT NULL AND a.attname <> ALL (c.columns)), '{}');
        IF c."to" = 'all' THEN
            audience := 'true';
            scope_expr := quote_literal('all');
        ELSE
            rule := regexp_match(c."to", '^([A-Za-z_][A-Za-z0-9_$]*)\s*(?:=\s*([A-Za-z_][A-Za-z0-9_$]*))?$');
            IF rule[2] IS NULL THEN
                audience := format('(j->>%L) = %L', rule[1], replica::text);
                scope_expr := quote_literal('id=' || replica::text);
            ELSE
                audience := format('(j->>%L) = %L', rule[1], me->>rule[2]);
                scope_expr := quote_literal(rule[2] || '=' || (me->>rule[2]));
            END IF;
        END IF;
        IF rs.partitioned_by IS NOT NULL THEN
            audience := audience || format(' AND (j->>%L) = %L', rs.partitioned_by, part);
            scope_expr := scope_expr || ' || ' || quote_literal('@' || part);
        END IF;
        RETURN QUERY EXECUTE format(
            'SELECT %L::text, k, b, encode(sha256(convert_to(b, ''UTF8'')), ''hex''), s,'
            '       sync.row_size(%L, k, b) + sync.chunk_size(s, 999999999, 999999999) > %s'
            ' FROM (SELECT sync.canonical((SELECT jsonb_object_agg(kc, j->kc) FROM unnest(%L::text[]) kc)) AS k,'
            '              sync.canonical(j - %L::text[]) AS b, %s AS s'
            '       FROM (SELECT to_jsonb(t) AS j FROM %s t) t WHERE %s) x',
            c.table_name, c.table_name, limit_bytes, c.key_columns, hidden, scope_expr, c.relation, audience);
    END LOOP;
END
$$;
