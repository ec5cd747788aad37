-- The relay pass (DESIGN §4) and the wire pieces its SQL uses -------------------------------------
--
-- The wire functions compute, never read the catalog: they pin no search_path, because every
-- pass calls them once per row and a SET clause would cost a GUC save and restore each time.

CREATE FUNCTION sync.canonical(jsonb) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_canonical' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- sync.canonical(to_jsonb(row) - hidden), written from the row's columns; NULL when a column is
-- of a type it leaves to to_jsonb (the pass then goes through to_jsonb). STABLE: timestamptz is
-- written in the session's time zone, as to_jsonb writes it.
CREATE FUNCTION sync.encode_row("row" record, hidden text[]) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_encode_row' LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.key_hash("table" text, key jsonb) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_key_hash' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.row_hash(body text) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_row_hash' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.fp_element(k bytea, v bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_fp_element' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.row_size("table" text, key text, body text) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_row_size' LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION sync.chunk_size(scope text, from_seq bigint, to_seq bigint) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_chunk_size' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.envelope_size(reset text[], drops text[], table_drops text[] DEFAULT '{}')
RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_envelope_size' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- How many of `drops`, then of `table_drops`, one rows message carries within
-- magic_sync.bytes_per_message; the rest wait for the next message.
CREATE FUNCTION sync.drops_fitting(reset text[], drops text[], table_drops text[]) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_drops_fitting' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- Whether a row can travel at all: within magic_sync.bytes_per_message, with no number a double
-- does not hold (protocol::row_travels); one that cannot is withheld. A property of the row and its
-- scope, not of any replica's cursor.
CREATE FUNCTION sync.row_travels(scope text, "table" text, key text, body text) RETURNS boolean
AS 'MODULE_PATHNAME', 'magic_sync_row_travels' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- The note announcing a withheld row of a scope, with why (its key, or its key's hash when the key
-- is too long for a note within magic_sync.bytes_per_message or holds a number past a double), the
-- bytes it adds to a message, and the reason it is set aside with.
CREATE FUNCTION sync.withheld_note(scope text, "table" text, key text, body text) RETURNS jsonb
AS 'MODULE_PATHNAME', 'magic_sync_withheld_note' LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.withheld_size(scope text, "table" text, key text, body text) RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_withheld_size' LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.withheld_reason(scope text, "table" text, key text, body text) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_withheld_reason' LANGUAGE C STABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.encode_chunk(scope text, from_seq bigint, to_seq bigint, seqs bigint[],
                                  tables text[], keys text[], bodies text[], hashes text[])
RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_encode_chunk' LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- Fingerprint arithmetic: 256-bit sums mod 2^256.
CREATE FUNCTION sync.fp_add(bytea, bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_fp_add' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.fp_sub(bytea, bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_fp_sub' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION sync.fp_zero() RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea;

CREATE AGGREGATE sync.fp_sum(bytea) (
    SFUNC = sync.fp_add,
    STYPE = bytea,
    INITCOND = '\x0000000000000000000000000000000000000000000000000000000000000000',
    COMBINEFUNC = sync.fp_add,
    PARALLEL = SAFE
);

-- A scope's name on the wire: all, all@p, id=<uuid>, store_id=42, store_id=42@p.
CREATE FUNCTION sync.scope_name(match text, value text, part text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE match WHEN '*' THEN 'all' ELSE match || '=' || value END
       || CASE WHEN part <> '' THEN '@' || part ELSE '' END;

-- One pass: takes the relay lock (or refuses), plans, writes the outbox. Returns its counts. It
-- writes keys, rows and scope values under fixed settings (TimeZone, IntervalStyle,
-- extra_float_digits, bytea_output), as sync.expected reads them: a row's canonical form is the
-- same whatever the server's or a session's settings.
-- The pass analyzes its temporary tables when it fills them and sync.row after many changes, so
-- the statements after join them by plan: the planner needs their sizes and ranges, not fine
-- histograms, and a sample of 3,000 rows instead of 30,000 took an analyze of sync.row from
-- 140-220 ms to 22-26 ms at 100,000 rows.
CREATE FUNCTION sync.pass(OUT notes bigint, OUT rows_changed bigint, OUT provisioned bigint,
                          OUT forgotten bigint, OUT messages bigint, OUT set_aside bigint)
AS 'MODULE_PATHNAME', 'magic_sync_pass'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp
SET default_statistics_target = 10
-- How values are written out (keys, rows, scope values) depends on no session or server setting.
SET TimeZone = 'UTC' SET IntervalStyle = 'postgres' SET extra_float_digits = 1
SET bytea_output = 'hex';

-- A message of a replica's outbox, assembled exactly as the sender sends it.
CREATE FUNCTION sync.message(replica uuid, seq bigint) RETURNS bytea
AS 'MODULE_PATHNAME', 'magic_sync_message'
LANGUAGE C STABLE STRICT
SET search_path = pg_catalog, pg_temp;

-- What the relay has pruned: tombstones every member of their scope confirmed, chunks no message
-- uses, filed-upload ids older than magic_sync.upload_memory (but those with rows still kept: the
-- retry answers them again when it files those).
CREATE FUNCTION sync.prune(OUT tombstones bigint, OUT chunks bigint, OUT uploads bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM sync.row r
    WHERE r.gone
      AND r.seq <= coalesce((SELECT min(m.confirmed) FROM sync.member m WHERE m.scope = r.scope),
                            r.seq);
    GET DIAGNOSTICS tombstones = ROW_COUNT;
    DELETE FROM sync.chunk c
    WHERE NOT EXISTS (SELECT FROM sync.outbox o WHERE c.id = ANY (o.chunks));
    GET DIAGNOSTICS chunks = ROW_COUNT;
    DELETE FROM sync.upload u
    WHERE u.filed_at < now() - sync.setting('upload_memory')::interval
      AND NOT EXISTS (SELECT FROM sync.set_aside s
                      WHERE s.kind = 'upload' AND s.replica = u.replica AND s.upload = u.id);
    GET DIAGNOSTICS uploads = ROW_COUNT;
END
$$;

-- sync.status (one row per replica) is defined with the truth functions, in 09_truth.sql.

-- Health of the relay, one row: the notes backlog, the lock holder, the last pass, what is set
-- aside, and the transaction horizon. Friendly to psql and to a Prometheus SQL exporter (numbers,
-- no units in text).
--
-- The horizon: the oldest transaction id still needed by a session of this database (its xid or
-- its snapshot's xmin: a session left in `BEGIN; SELECT txid_current();`), a prepared transaction
-- or a replication slot. While it is held back VACUUM cannot remove the notes the relay took, the
-- outbox rows it pruned nor the row versions it replaced after it, so passes and the sender walk
-- more and more dead versions. horizon_held_by says what holds it ('session', 'prepared', 'slot'),
-- horizon_pid which session, horizon_xmin_age how many transactions old it is, horizon_seconds
-- since when (the session's transaction start or the prepare; a role that is neither the
-- session's nor granted pg_read_all_stats sees NULL there).
CREATE VIEW sync.health AS
SELECT (SELECT count(*) FROM sync.note) AS notes_backlog,
       (SELECT extract(epoch FROM now() - min(noted_at)) FROM sync.note) AS oldest_note_seconds,
       sync.relay_lock_holder() AS relay_pid,
       st.last_pass_at,
       (st.last_pass->>'notes')::bigint AS last_pass_notes,
       (st.last_pass->>'rows_changed')::bigint AS last_pass_rows_changed,
       (st.last_pass->>'messages')::bigint AS last_pass_messages,
       (SELECT count(*) FROM sync.set_aside WHERE kind = 'note') AS set_aside_notes,
       (SELECT count(*) FROM sync.set_aside WHERE kind = 'row') AS set_aside_rows,
       (SELECT count(*) FROM sync.set_aside WHERE kind = 'upload') AS set_aside_uploads,
       (SELECT count(*) FROM sync.set_aside WHERE kind = 'untaken') AS set_aside_untaken,
       h.held_by AS horizon_held_by,
       h.pid AS horizon_pid,
       h.xmin_age AS horizon_xmin_age,
       h.seconds AS horizon_seconds
FROM sync.relay_state st
LEFT JOIN LATERAL (
    SELECT 'session'::text AS held_by, a.pid,
           greatest(age(a.backend_xid), age(a.backend_xmin))::bigint AS xmin_age,
           extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS seconds
    FROM pg_catalog.pg_stat_activity a
    WHERE a.datname = current_database()
      AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
      -- An autovacuum worker's snapshot lasts one table's vacuum: nothing for anyone to act on.
      AND a.backend_type <> 'autovacuum worker'
    UNION ALL
    SELECT 'prepared', NULL, age(p.transaction)::bigint,
           extract(epoch FROM clock_timestamp() - p.prepared)::float8
    FROM pg_catalog.pg_prepared_xacts p
    WHERE p.database = current_database()
    UNION ALL
    SELECT 'slot', NULL, age(s.xmin)::bigint, NULL
    FROM pg_catalog.pg_replication_slots s
    WHERE s.xmin IS NOT NULL
    ORDER BY xmin_age DESC, seconds DESC NULLS LAST
    LIMIT 1) h ON true;
