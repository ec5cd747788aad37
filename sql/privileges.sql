-- Privileges (docs/DESIGN.md §10): PUBLIC can call nothing in schema sync; sync_sender calls only the
-- sender's functions (next, sent, failed, backlog, and pull_head, pull_ack, pull_refused for
-- the pull transport, and fleet for its page), sync_receiver only sync.receive (which
-- runs its helpers as the extension's owner) and sync_monitor only the monitoring functions
-- (sync.replica_counts, sync.relay_health, sync.fleet); none reads a sync table or changes a declaration. The
-- settings and hooks that choose a role cannot be turned into more privilege: magic_sync.role is
-- a superuser's setting, SET ROLE to it needs membership, the hooks run as the caller, and the
-- relay's retry files a kept upload as the role that sent it.
CREATE DATABASE privileges_test;
\c privileges_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.sales (id int PRIMARY KEY, total int NOT NULL);
CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY, counted int);
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products');
SELECT sync.record('shop.sales');
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted']);
CREATE FUNCTION shop.known(register uuid) RETURNS jsonb LANGUAGE sql STABLE
AS $$ SELECT jsonb_build_object('register', r.id) FROM shop.registers r WHERE r.id = register AND r.active $$;
CREATE FUNCTION shop.as_register(known jsonb) RETURNS void LANGUAGE sql
AS $$ SELECT set_config('shop.register', known->>'register', true) $$;
SELECT sync.senders(known => 'shop.known(uuid)'::regprocedure,
                    filing => 'shop.as_register(jsonb)'::regprocedure);
-- A register writes only its own drawer.
ALTER TABLE shop.drawers ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_drawer ON shop.drawers
    USING (register_id = current_setting('shop.register')::uuid)
    WITH CHECK (register_id = current_setting('shop.register')::uuid);
INSERT INTO shop.registers VALUES ('00000000-0000-0000-0000-0000000000a1'), ('00000000-0000-0000-0000-0000000000b1');
INSERT INTO shop.products VALUES (1, 'tea');
INSERT INTO shop.drawers VALUES ('00000000-0000-0000-0000-0000000000b1', 7);
SELECT provisioned, messages FROM sync.pass();

-- The sender's and the route's login roles, one with no grant at all, and the app's owner.
CREATE ROLE priv_sender IN ROLE sync_sender;
CREATE ROLE priv_receiver IN ROLE sync_receiver;
CREATE ROLE priv_nobody;
CREATE ROLE priv_owner;
GRANT USAGE ON SCHEMA shop TO PUBLIC;
GRANT SELECT ON shop.registers TO priv_receiver;
GRANT SELECT, INSERT, UPDATE ON shop.drawers TO priv_receiver;
-- shop.sales: no INSERT for the route yet (granted further down).
GRANT SELECT ON shop.sales TO priv_receiver;
CREATE SCHEMA route_own AUTHORIZATION priv_receiver;

-- The routines of schema sync anyone besides its owner may call: only the sender's, the
-- receiver's and the monitor's, and nothing for PUBLIC.
SELECT p.oid::regprocedure AS routine,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public,
       has_function_privilege('sync_sender', p.oid, 'EXECUTE') AS sender,
       has_function_privilege('sync_receiver', p.oid, 'EXECUTE') AS receiver,
       has_function_privilege('sync_monitor', p.oid, 'EXECUTE') AS monitor
FROM pg_proc p
WHERE p.pronamespace IN ('sync'::regnamespace, 'sync_internal'::regnamespace)
  AND (has_function_privilege('public', p.oid, 'EXECUTE')
       OR has_function_privilege('sync_sender', p.oid, 'EXECUTE')
       OR has_function_privilege('sync_receiver', p.oid, 'EXECUTE')
       OR has_function_privilege('sync_monitor', p.oid, 'EXECUTE'))
ORDER BY p.oid::regprocedure::text;
-- No table, view or sequence of schema sync is open to anyone but its owner; the schema is
-- usable by the three roles only, creatable in by nobody.
SELECT c.oid::regclass AS relation, r.role
FROM pg_class c, (VALUES ('public'), ('sync_sender'), ('sync_receiver'), ('sync_monitor')) AS r(role)
WHERE c.relnamespace = 'sync'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p', 'f')
  AND has_table_privilege(r.role, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
UNION ALL
SELECT c.oid::regclass, r.role
FROM pg_class c, (VALUES ('public'), ('sync_sender'), ('sync_receiver'), ('sync_monitor')) AS r(role)
WHERE c.relnamespace = 'sync'::regnamespace AND c.relkind = 'S'
  AND has_sequence_privilege(r.role, c.oid, 'USAGE, SELECT, UPDATE');
SELECT r.role, s.schema, has_schema_privilege(r.role, s.schema, 'USAGE') AS usage,
       has_schema_privilege(r.role, s.schema, 'CREATE') AS "create"
FROM (VALUES ('public'), ('sync_sender'), ('sync_receiver'), ('sync_monitor')) AS r(role),
     (VALUES ('sync'), ('sync_internal')) AS s(schema)
ORDER BY s.schema, r.role;
-- Every SECURITY DEFINER routine pins its search_path, so a caller's objects cannot stand in for
-- the ones it means.
SELECT p.oid::regprocedure AS unpinned FROM pg_proc p
WHERE p.pronamespace IN ('sync'::regnamespace, 'sync_internal'::regnamespace) AND p.prosecdef
  AND NOT coalesce(p.proconfig::text[] && ARRAY['search_path=pg_catalog, pg_temp'], false);

-- What each role gets when it tries: one statement per row, run in turn by each role as its
-- session's own (so SET ROLE checks that role's memberships). The bootstrap superuser's name
-- shows as <superuser>.
CREATE FUNCTION attempt(who text, statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    superuser text := (SELECT rolname FROM pg_roles WHERE oid = 10);
BEGIN
    BEGIN
        EXECUTE format('SET LOCAL SESSION AUTHORIZATION %I', who);
        EXECUTE statement;
        RESET SESSION AUTHORIZATION;
        RETURN 'ok';
    EXCEPTION WHEN OTHERS THEN
        RETURN replace(SQLERRM, superuser, '<superuser>');
    END;
END
$$;
CREATE TABLE attempts (n serial PRIMARY KEY, statement text NOT NULL);
INSERT INTO attempts (statement) VALUES
    -- The relay's state and the outboxes.
    ('SELECT count(*) FROM sync.outbox'),
    ('SELECT count(*) FROM sync.replica'),
    ('SELECT count(*) FROM sync.chunk'),
    ('SELECT count(*) FROM sync.set_aside'),
    ('SELECT count(*) FROM sync.upload'),
    ('SELECT count(*) FROM sync.status'),
    ('SELECT count(*) FROM sync.health'),
    ('SELECT sync.message(''00000000-0000-0000-0000-0000000000b1'', 1)'),
    ('SELECT sync_internal.encode_filed(''00000000-0000-0000-0000-0000000000b1'', 1, 1, ''{}'')'),
    ('SELECT * FROM sync.verify(''00000000-0000-0000-0000-0000000000b1'')'),
    -- The relay's work.
    ('SELECT sync.pass()'),
    ('SELECT sync.prune()'),
    ('SELECT * FROM sync.retry_set_aside()'),
    ('CALL sync.relay()'),
    ('SELECT sync.start_relay()'),
    ('SELECT sync_internal.relay_lock()'),
    -- Declarations and the senders' hooks.
    ('SELECT sync.replicas(''shop.registers'', ''tills'')'),
    ('SELECT sync.catalog(''shop.sales'')'),
    ('SELECT sync.record(''shop.products'')'),
    ('SELECT sync.both(''shop.products'', replica_columns => ARRAY[''name''])'),
    ('SELECT sync.drop(''shop.drawers'')'),
    ('SELECT sync.senders(filing => ''shop.as_register(jsonb)''::regprocedure)'),
    ('UPDATE sync.sender_rule SET filing = NULL'),
    ('UPDATE sync.codec SET kind = ''record'''),
    ('DELETE FROM sync.replica_set'),
    ('CREATE FUNCTION sync.mine() RETURNS int LANGUAGE sql AS ''SELECT 1'''),
    ('CREATE TABLE sync.mine (x int)'),
    -- The sender's functions.
    ('SELECT count(*) FROM sync.next(10, ''1 hour'')'),
    ('SELECT sync.sent(''00000000-0000-0000-0000-0000000000b1'', 1)'),
    ('SELECT sync.failed(''00000000-0000-0000-0000-0000000000b1'', 2, true, ''try'')'),
    ('SELECT * FROM sync.backlog()'),
    -- The receiver's.
    ('SELECT sync.receive(''00000000-0000-0000-0000-0000000000a1'', convert_to(''{"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":[]}'', ''UTF8''))'),
    -- The helpers sync.receive runs as the extension's owner: no role calls them itself (a
    -- forged answer, holding or kept row; an upload id claimed before the genuine upload).
    ('SELECT sync_internal.upload_end(''00000000-0000-0000-0000-0000000000a1'', ''10000000-0000-0000-0000-000000000002'', ''[{"t":"x","k":{},"why":"forged"}]'', NULL, ''[]'', ''{"all":{"through":1,"fp":"00","n":1}}'', true)'),
    ('SELECT sync_internal.upload_begin(''00000000-0000-0000-0000-0000000000a1'', ''10000000-0000-0000-0000-000000000003'')'),
    ('SELECT sync_internal.keep_upload(''00000000-0000-0000-0000-0000000000a1'', ''10000000-0000-0000-0000-000000000004'', NULL, ''[]'')'),
    ('SELECT sync_internal.upload_echoes(''00000000-0000-0000-0000-0000000000a1'', ''10000000-0000-0000-0000-000000000005'', ''[]'')'),
    ('SELECT sync_internal.keep_message(''00000000-0000-0000-0000-0000000000a1'', ''\x00'', ''forged'')'),
    ('SELECT * FROM sync_internal.receive_setup(''00000000-0000-0000-0000-0000000000a1'')'),
    ('SELECT * FROM sync_internal.receive_undeclared(ARRAY[''shop.sales''])'),
    ('SELECT * FROM sync_internal.codec_columns(NULL, ARRAY[''shop.sales''])'),
    -- magic_sync.role and other ways to another role: a superuser's, or a member's.
    ('SET magic_sync.role = priv_owner'),
    ('SELECT set_config(''magic_sync.role'', ''priv_owner'', false)'),
    ('ALTER ROLE priv_receiver SET magic_sync.role = priv_owner'),
    ('CREATE FUNCTION route_own.as_owner() RETURNS text LANGUAGE sql SET magic_sync.role = priv_owner AS ''SELECT current_user'''),
    ('SET ROLE priv_owner');
SELECT a.n, a.statement, attempt('priv_sender', a.statement) AS sync_sender,
       attempt('priv_receiver', a.statement) AS sync_receiver, attempt('priv_nobody', a.statement) AS nobody
FROM (SELECT * FROM attempts WHERE n < 33 ORDER BY n OFFSET 0) a;
\x on
SELECT a.n, a.statement, attempt('priv_sender', a.statement) AS sync_sender,
       attempt('priv_receiver', a.statement) AS sync_receiver, attempt('priv_nobody', a.statement) AS nobody
FROM (SELECT * FROM attempts WHERE n >= 33 ORDER BY n OFFSET 0) a;
\x off
-- Nothing of theirs stayed behind.
SELECT (SELECT count(*) FROM sync.codec) AS codecs, (SELECT filing::text FROM sync.sender_rule) AS filing,
       (SELECT count(*) FROM pg_proc WHERE proname = 'mine') AS mine, (SELECT count(*) FROM sync.upload) AS uploads;

-- magic_sync.role set by a superuser to a role the route's login is not a member of (the
-- superuser, the app's owner): receive refuses to run, says why, and files and keeps nothing.
CREATE FUNCTION receive_as_route(role_setting text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    superuser text := (SELECT rolname FROM pg_roles WHERE oid = 10);
    status text;
    hint text;
BEGIN
    PERFORM set_config('magic_sync.role', role_setting, true);
    SET LOCAL SESSION AUTHORIZATION priv_receiver;
    status := sync.receive('00000000-0000-0000-0000-0000000000a1',
        convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000002","rows":[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":1}}]}', 'UTF8'));
    RESET SESSION AUTHORIZATION;
    PERFORM set_config('magic_sync.role', '', true);
    RETURN status;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
    RETURN replace(format('%s: %s%s', SQLSTATE, SQLERRM, coalesce(' (hint: ' || nullif(hint, '') || ')', '')),
                   superuser, '<superuser>');
END
$$;
\x on
SELECT receive_as_route((SELECT rolname FROM pg_roles WHERE oid = 10)) AS as_superuser,
       receive_as_route('priv_owner') AS as_owner;
\x off
SELECT current_user = session_user AS own_session, current_setting('magic_sync.role') AS role_setting,
       (SELECT count(*) FROM shop.drawers) AS drawers, (SELECT count(*) FROM sync.set_aside) AS set_aside,
       (SELECT count(*) FROM sync.upload) AS uploads;
-- The hooks run as the caller: a filing() the route may not execute stops the receive with an
-- ERROR (nothing filed or kept), it does not run with more rights.
REVOKE EXECUTE ON FUNCTION shop.as_register(jsonb) FROM PUBLIC;
SELECT receive_as_route('') AS filing_not_executable;
GRANT EXECUTE ON FUNCTION shop.as_register(jsonb) TO PUBLIC;

-- A row the route's policy or privileges refused is kept until what filing depends on changes;
-- then the relay's retry (run by a superuser, which bypasses both) files it again as the route's
-- role: refused again. Here a register writes another register's drawer, and a sale the route
-- may not insert.
SET SESSION AUTHORIZATION priv_receiver;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000003","rows":[
    {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000b1","counted":0}},
    {"t":"shop.sales","r":{"id":1,"total":5}}]}', 'UTF8'));
RESET SESSION AUTHORIZATION;
SELECT kind, key, reason, tries, filed_as FROM sync.set_aside ORDER BY id;
SELECT * FROM sync.retry_set_aside();
COMMENT ON TABLE shop.drawers IS 'one per register';
SELECT * FROM sync.retry_set_aside();
SELECT current_user = session_user AS own_role, current_setting('role') AS role;
SELECT kind, key, reason, tries, filed_as FROM sync.set_aside ORDER BY id;
SELECT * FROM shop.drawers;
SELECT * FROM shop.sales;
-- The fix for the sale is deployed (the route may insert sales): the retry files it, as the
-- route; the drawer stays refused.
-- sync.check() said so: the route's role lacks INSERT on shop.sales, and (its SELECT taken back
-- here) SELECT on the key, which insert-if-absent reads. Granted exactly that, it files.
REVOKE SELECT ON shop.sales FROM priv_receiver;
SELECT * FROM sync.check();
GRANT INSERT, SELECT (id) ON shop.sales TO priv_receiver;
SELECT * FROM sync.check();
-- Filing reaches a table through its schema: without USAGE on it every row is kept ("permission
-- denied for schema shop"), so sync.check() names that grant too; and known(), in that schema
-- too, cannot be called: every upload fails.
REVOKE USAGE ON SCHEMA shop FROM PUBLIC;
SELECT * FROM sync.check();
GRANT USAGE ON SCHEMA shop TO priv_receiver;
SELECT * FROM sync.check();
GRANT USAGE ON SCHEMA shop TO PUBLIC;
REVOKE USAGE ON SCHEMA shop FROM priv_receiver;
SELECT * FROM sync.retry_set_aside();
SELECT kind, key, reason, tries, filed_as FROM sync.set_aside ORDER BY id;
SELECT * FROM shop.sales;
SELECT * FROM shop.drawers;
-- A message kept whole (here: over magic_sync.max_upload_bytes) is filed by the retry, after a
-- change, as the receiver too, and refused the same.
SET magic_sync.max_upload_bytes = 1024;
SET SESSION AUTHORIZATION priv_receiver;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000004","rows":[' || repeat(' ', 1024) || '
    {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000b1","counted":-1}}]}', 'UTF8'));
RESET SESSION AUTHORIZATION;
RESET magic_sync.max_upload_bytes;
COMMENT ON TABLE shop.drawers IS 'one per register, counted';
SELECT * FROM sync.retry_set_aside();
SELECT kind, key, reason, tries, filed_as FROM sync.set_aside ORDER BY id;
SELECT * FROM shop.drawers;
-- A kept upload whose role is gone is not filed by anyone else: it stays kept, and says why.
UPDATE sync.set_aside SET filed_as = 'priv_gone';
COMMENT ON TABLE shop.drawers IS 'one per register, counted again';
SELECT * FROM sync.retry_set_aside();
SELECT kind, key, reason, tries, filed_as FROM sync.set_aside ORDER BY id;

-- A both row's columns that are NOT NULL with nothing to fill them in, and that the replica may
-- not write, are read from the stored row (PostgreSQL checks NOT NULL before it finds the
-- conflict): filing needs SELECT on them too, and sync.check() names it.
DELETE FROM sync.set_aside;
ALTER TABLE shop.drawers ADD COLUMN station text NOT NULL DEFAULT 'front';
ALTER TABLE shop.drawers ALTER COLUMN station DROP DEFAULT;
REVOKE SELECT ON shop.drawers FROM priv_receiver;
GRANT SELECT (register_id, counted) ON shop.drawers TO priv_receiver;
SELECT * FROM sync.check();
SET SESSION AUTHORIZATION priv_receiver;
SELECT sync.receive('00000000-0000-0000-0000-0000000000b1', convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000005","rows":[
    {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000b1","counted":8}}]}', 'UTF8'));
RESET SESSION AUTHORIZATION;
SELECT kind, key, reason FROM sync.set_aside ORDER BY id;
GRANT SELECT (station) ON shop.drawers TO priv_receiver;
SELECT * FROM sync.check();
SET SESSION AUTHORIZATION priv_receiver;
SELECT sync.receive('00000000-0000-0000-0000-0000000000b1', convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000006","rows":[
    {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000b1","counted":9}}]}', 'UTF8'));
RESET SESSION AUTHORIZATION;
SELECT * FROM shop.drawers;

\c regression
DROP DATABASE privileges_test;
DROP ROLE priv_sender, priv_receiver, priv_nobody, priv_owner;
