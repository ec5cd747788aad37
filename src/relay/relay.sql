-- The relay pass (docs/DESIGN.md §4) ----------------------------------------------------------------------

-- One pass: takes the relay lock (or refuses), plans, writes the outbox. Returns its counts. It
-- writes keys, rows and scope values under fixed settings (TimeZone, DateStyle, IntervalStyle,
-- extra_float_digits, bytea_output, lc_monetary: sync_internal.pin_output_settings), as sync.expected
-- reads them: a row's canonical form is the same whatever the server's or a session's settings.
-- The pass analyzes its temporary tables when it fills them and sync.row after many changes, so
-- the statements after join them by plan: the planner needs their sizes and ranges, not fine
-- histograms, and a sample of 3,000 rows instead of 30,000 took an analyze of sync.row from
-- 140-220 ms to 22-26 ms at 100,000 rows.
-- Without JIT: its statements read by key what one pass touches, but a working table's
-- statistics taken at a large pass (a queue of 50,000 messages) put some of the next passes'
-- plans past jit_above_cost, and compiling them cost 30 ms where running them cost 2: in a fan-out
-- to 10,000 replicas, 3.8 s of the relay's 15 s of CPU (auto_explain, build/bench/fanout).
CREATE FUNCTION sync.pass(OUT notes bigint, OUT rows_changed bigint, OUT provisioned bigint,
                          OUT forgotten bigint, OUT messages bigint, OUT set_aside bigint)
AS 'MODULE_PATHNAME', 'magic_sync_pass'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp
SET default_statistics_target = 10
SET jit = off;
SELECT sync_internal.pin_output_settings('sync.pass()');

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

-- sync.status (one row per replica) is defined with the truth functions, in src/verify/truth.sql.

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
SELECT (SELECT coalesce(sum(key_count), 0) FROM sync.note) AS notes_backlog,
       (SELECT extract(epoch FROM now() - min(noted_at)) FROM sync.note) AS oldest_note_seconds,
       sync_internal.relay_lock_holder() AS relay_pid,
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
      -- Nor the session asking: its own snapshot's xmin is the oldest xid running anywhere in the
      -- cluster, so beside an older transaction of another database it came first and named
      -- itself (sql/health.sql, beside the other regress tests).
      AND a.pid <> pg_catalog.pg_backend_pid()
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
