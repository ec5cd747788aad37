-- The wire's SQL-callable pieces: canonical JSON, hashes, sizes, chunks, answers ------------------
--
-- The wire functions compute, never read the catalog: they pin no search_path, because every
-- pass calls them once per row and a SET clause would cost a GUC save and restore each time.

CREATE FUNCTION sync_internal.canonical(jsonb) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_canonical' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- The body a row travels as: its canonical JSON without the `hidden` columns, written from its
-- columns as to_json writes them (floats exactly, src/pg/jsonb_canonical.cpp), or where that
-- cannot be decided, through to_json's text, which refuses a row deeper or longer than a message
-- may carry with the exact error. STABLE: timestamptz is written in the session's time zone.
CREATE FUNCTION sync_internal.encode_row("row" record, hidden text[]) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_encode_row' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- A row as to_json wrote it, in canonical JSON without the hidden columns: how the truth audit
-- writes a row, apart from encode_row's walk.
CREATE FUNCTION sync_internal.canonical_row("row" json, hidden text[]) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_canonical_row' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.key_hash("table" text, key jsonb) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_key_hash' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.row_hash(body text) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_row_hash' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.fp_element(k bytea, v bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_fp_element' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.row_size("table" text, key text, body text) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_row_size' LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION sync_internal.chunk_size(scope text, from_seq bigint, to_seq bigint) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_chunk_size' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.envelope_size(reset text[], drops text[], table_drops text[] DEFAULT '{}')
RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_envelope_size' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- How many of `drops`, then of `table_drops`, one rows message carries within
-- magic_sync.bytes_per_message; the rest wait for the next message.
CREATE FUNCTION sync_internal.drops_fitting(reset text[], drops text[], table_drops text[]) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_drops_fitting' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- Whether a row can travel at all: within magic_sync.bytes_per_message, with no number a double
-- does not hold (protocol::row_travels); one that cannot is withheld. A property of the row and its
-- scope, not of any replica's cursor.
CREATE FUNCTION sync_internal.row_travels(scope text, "table" text, key text, body text) RETURNS boolean
AS 'MODULE_PATHNAME', 'magic_sync_row_travels' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- The note announcing a withheld row of a scope, with why (its key, or its key's hash when the key
-- is too long for a note within magic_sync.bytes_per_message or holds a number past a double), the
-- bytes it adds to a message, and the reason it is set aside with.
CREATE FUNCTION sync_internal.withheld_note(scope text, "table" text, key text, body text) RETURNS jsonb
AS 'MODULE_PATHNAME', 'magic_sync_withheld_note' LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.withheld_size(scope text, "table" text, key text, body text) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_withheld_size' LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.withheld_reason(scope text, "table" text, key text, body text) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_withheld_reason' LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.encode_chunk(scope text, from_seq bigint, to_seq bigint, seqs bigint[],
                                  tables text[], keys text[], bodies text[], hashes text[])
RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_encode_chunk' LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- Fingerprint arithmetic: 256-bit sums mod 2^256.
CREATE FUNCTION sync_internal.fp_add(bytea, bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_fp_add' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.fp_sub(bytea, bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_fp_sub' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync_internal.fp_zero() RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;

CREATE AGGREGATE sync_internal.fp_sum(bytea) (
    SFUNC = sync_internal.fp_add,
    STYPE = bytea,
    INITCOND = '\x0000000000000000000000000000000000000000000000000000000000000000',
    COMBINEFUNC = sync_internal.fp_add,
    PARALLEL = SAFE
);

-- A scope's name on the wire: all, all@p, id=<uuid>, store_id=42, store_id=42@p.
CREATE FUNCTION sync_internal.scope_name(match text, value text, part text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE match WHEN '*' THEN 'all' ELSE match || '=' || value END
       || CASE WHEN part <> '' THEN '@' || part ELSE '' END;

-- The payload of a filed answer, as sync.answer keeps it until the relay numbers its message: the
-- upload it answers and its rows not filed, [{"t": table, "k": key, "why": reason}, ...] (the
-- protocol's encode_filed_payload writes the same form).
CREATE FUNCTION sync_internal.filed_payload(upload uuid, kept jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN jsonb_build_object('upload', upload, 'kept', kept);

-- The filed message with its header, as the relay puts it in the outbox, from its payload
-- (sync_internal.filed_payload).
CREATE FUNCTION sync_internal.encode_filed(replica uuid, gen bigint, seq bigint, payload jsonb) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_encode_filed' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- An answer too big for one message goes in parts: the payloads of the parts, in order, each of
-- which encodes within max_bytes (every part but the last says "more"; a reason too long for a
-- part of its own is cut).
CREATE FUNCTION sync_internal.filed_parts(replica uuid, payload jsonb, max_bytes bigint) RETURNS jsonb
AS 'MODULE_PATHNAME', 'magic_sync_filed_parts' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;


-- An encoded down message with another header (gen and seq), as it enters the outbox.
CREATE FUNCTION sync_internal.stamp_message(message bytea, replica uuid, gen bigint, seq bigint) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_stamp_message' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- How values are written out (keys, rows, scope values) depends on no session or server setting:
-- every function that encodes values or compares their text (the pass, the oracle, the audit)
-- runs under these settings, pinned by this one owner.
CREATE FUNCTION sync_internal.pin_output_settings(routine regprocedure) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('ALTER FUNCTION %s SET TimeZone = %L SET DateStyle = %L SET IntervalStyle = %L'
                   ' SET extra_float_digits = 1 SET bytea_output = %L SET lc_monetary = %L',
                   routine, 'UTC', 'ISO, MDY', 'postgres', 'hex', 'C');
END
$$;
