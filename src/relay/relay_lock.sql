-- The relay lock ---------------------------------------------------------------------------------

-- A magic_sync.* setting, read through the library so that it is loaded (src/pg/init.cpp).
CREATE FUNCTION sync.setting(name text) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_setting' LANGUAGE C STABLE STRICT PARALLEL SAFE;

-- The relay runs as soon as the current transaction commits (defined first: the DDL of the
-- rest of this script wakes it, src/filing/set_aside.sql).
CREATE FUNCTION sync_internal.wake() RETURNS void
AS 'MODULE_PATHNAME', 'magic_sync_wake'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

-- The pid of the session holding the relay's session advisory lock in this database, if any.
CREATE FUNCTION sync_internal.relay_lock_holder() RETURNS int
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.pid FROM pg_locks l
    JOIN pg_database d ON d.oid = l.database AND d.datname = current_database()
    WHERE l.locktype = 'advisory' AND l.granted
      AND l.classid = 1836281443 AND l.objid = 1 AND l.objsubid = 2
$$;

-- The extension's users and DROP EXTENSION take their table locks in one order: each relay
-- transaction (a pass, a slice of a retry), sync.receive and the senders' functions first take
-- sync.relay_state in ROW SHARE mode, and DROP EXTENSION first takes it in ACCESS EXCLUSIVE mode
-- (an event trigger, before it drops anything). Otherwise the drop, locking the extension's
-- tables one by one, and a pass or a filing, locking them in its own order, deadlocked (seen by
-- the simulation: DROP EXTENSION magic_sync CASCADE failed with "deadlock detected" while the
-- worker ran and replicas uploaded). ROW SHARE conflicts with nothing else they do.
CREATE FUNCTION sync_internal.relay_guard() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOCK TABLE sync.relay_state IN ROW SHARE MODE;
END
$$;

CREATE FUNCTION sync_internal.before_drop_extension() RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    LOCK TABLE sync.relay_state IN ACCESS EXCLUSIVE MODE;
END
$$;
CREATE EVENT TRIGGER magic_sync_before_drop_extension ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION') EXECUTE FUNCTION sync_internal.before_drop_extension();

-- Whether no session uses temporary schema `schema` (src/pg/init.cpp).
CREATE FUNCTION sync_internal.temp_schema_orphaned(schema oid) RETURNS boolean
AS 'MODULE_PATHNAME', 'magic_sync_temp_schema_orphaned'
LANGUAGE C VOLATILE STRICT
SET search_path = pg_catalog, pg_temp;

-- The working tables (pg_temp.magic_sync_*) a relay left when its session ended without dropping
-- them (it was killed and the server restarted), dropped by the relay that takes the lock next;
-- otherwise autovacuum would drop them one by one, with a LOG line each, whenever it came to them.
-- Only tables of schemas no session uses: a session that gets that temporary schema later clears it
-- itself. Returns how many were dropped.
CREATE FUNCTION sync_internal.drop_dead_relays_tables() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    left_behind regclass;
    dropped bigint := 0;
BEGIN
    FOR left_behind IN
        SELECT c.oid::regclass FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname ~ '^pg_temp_[0-9]+$' AND n.oid IS DISTINCT FROM pg_my_temp_schema()
          AND c.relkind = 'r' AND c.relname LIKE 'magic\_sync\_%'
          AND sync_internal.temp_schema_orphaned(n.oid)
    LOOP
        EXECUTE format('DROP TABLE %s', left_behind);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$$;

-- Takes the relay lock if it is free and keeps it for the session; returns this session's pid.
-- Refuses when another session holds it.
CREATE FUNCTION sync_internal.relay_lock() RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    holder int := sync_internal.relay_lock_holder();
BEGIN
    IF holder = pg_backend_pid() OR (holder IS NULL AND pg_try_advisory_lock(1836281443, 1)) THEN
        RETURN pg_backend_pid();
    END IF;
    RAISE EXCEPTION 'the magic_sync relay lock is held by another session (pid %)',
                    coalesce(sync_internal.relay_lock_holder()::text, 'unknown')
        USING ERRCODE = 'lock_not_available',
              DETAIL = 'Only the session that holds the lock runs passes; this one stands by.',
              HINT = 'If no other relay runs, this session reached PostgreSQL through a pooler '
                     'in transaction mode (PgBouncer''s default), which runs each transaction on '
                     'another server session: connect directly or through a pooler in session mode.';
END
$$;
