-- The relay lock ---------------------------------------------------------------------------------

-- A magic_sync.* setting, read through the library so that it is loaded (src/pg/init.cpp).
CREATE FUNCTION sync.setting(name text) RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_setting' LANGUAGE C STABLE STRICT PARALLEL SAFE;

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
