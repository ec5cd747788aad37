-- Each codec's columns, one row per column, key columns first in key order then by position: the
-- one reading of a codec, for the pass that encodes its rows and for filing that writes them
-- (src/state/codec.cpp). Codecs by id (`codecs`) or by their name on the wire (`tables`); a codec
-- whose table is gone is left out. relation: quoted and schema-qualified. travels: sent to
-- replicas (a declaration's columns, or all). may_file: taken from an upload (a record's
-- travelling columns, a both's replica_columns; never a generated column). key_cast: a key
-- column's type when its jsonb field casts straight to it (a scalar whose text form to_jsonb
-- writes), else ''. both_audience: a both codec's rule as SQL over the row `t` and the replica's
-- row `r` of the replicas relation (sync.audience_sql).
CREATE FUNCTION sync_internal.codec_columns(codecs int[], tables text[])
RETURNS TABLE (id int, table_name text, relation text, kind text, audience text, to_column text,
               replica_column text, both_audience text, column_name text, is_key boolean,
               travels boolean, may_file boolean, is_stamp boolean, is_required boolean,
               key_cast text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.id, c.table_name, format('%I.%I', n.nspname, t.relname), c.kind, c.audience,
           c.to_column::text, c.replica_column::text,
           CASE WHEN c.kind = 'both' THEN sync.audience_sql(c.id, 't', 'r') END,
           a.attname::text,
           a.attname = ANY (c.key_columns),
           c.columns IS NULL OR a.attname = ANY (c.columns),
           a.attgenerated = '' AND
           CASE c.kind WHEN 'record' THEN c.columns IS NULL OR a.attname = ANY (c.columns)
                       WHEN 'both' THEN a.attname = ANY (c.replica_columns)
                       ELSE false END,
           a.attname = ANY (c.stamp),
           a.attname = ANY (required.columns),
           CASE WHEN a.attname <> ALL (c.key_columns) THEN NULL
                WHEN y.typtype IN ('b', 'e') AND (y.typcategory IN
                     ('B', 'D', 'E', 'I', 'N', 'S', 'T', 'V') OR y.oid = 'uuid'::regtype)
                THEN format_type(a.atttypid, NULL) ELSE '' END
    FROM sync.codec c
    JOIN pg_class t ON t.oid = c.relation
    JOIN pg_namespace n ON n.oid = t.relnamespace
    CROSS JOIN LATERAL sync_internal.required_columns(c.relation) AS required(columns)
    JOIN pg_attribute a ON a.attrelid = c.relation AND a.attnum > 0 AND NOT a.attisdropped
    JOIN pg_type y ON y.oid = a.atttypid
    WHERE c.id = ANY (codecs) OR c.table_name = ANY (tables)
    ORDER BY c.id, coalesce(array_position(c.key_columns, a.attname), 2147483647), a.attnum;
END
$$;
