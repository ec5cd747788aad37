-- sync.check() names what the roles that file uploads lack to run the senders' hooks (issue 37):
-- USAGE on a hook's schema, EXECUTE on it, and what its body needs as that role, found by running
-- known() and filing() as the role in a subtransaction that is always rolled back. Each fix is
-- the statement to run: here they are run as sync.check() gives them (\gexec).
CREATE DATABASE hook_grants_test;
\c hook_grants_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA app;
CREATE TABLE app.devices (id uuid PRIMARY KEY, site int NOT NULL, active boolean NOT NULL DEFAULT true);
CREATE TABLE app.sites (id int PRIMARY KEY, open boolean NOT NULL, visits int NOT NULL DEFAULT 0);
CREATE TABLE app.readings (device uuid, n int, value int, PRIMARY KEY (device, n));
CREATE TABLE app.visits (device uuid, site int);
SELECT sync.replicas('app.devices', 'devices', live => 'active');
SELECT sync.record('app.readings');
INSERT INTO app.sites VALUES (1, true);
INSERT INTO app.devices VALUES ('00000000-0000-0000-0000-0000000000a1', 1);
SELECT provisioned FROM sync.pass();

-- The route's role: what filing app.readings needs, and the devices known() reads; not the sites.
CREATE ROLE hook_route IN ROLE sync_receiver;
GRANT USAGE ON SCHEMA app TO hook_route;
GRANT INSERT, SELECT (device, n) ON app.readings TO hook_route;
GRANT SELECT ON app.devices TO hook_route;
CREATE FUNCTION upload(id int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    status text;
BEGIN
    SET LOCAL SESSION AUTHORIZATION hook_route;
    status := sync.receive('00000000-0000-0000-0000-0000000000a1',
        convert_to(format('{"v":1,"id":"10000000-0000-0000-0000-%s","rows":[{"t":"app.readings","r":{"device":"00000000-0000-0000-0000-0000000000a1","n":%s,"value":7}}]}',
                          lpad(id::text, 12, '0'), id), 'UTF8'));
    RESET SESSION AUTHORIZATION;
    RETURN status;
EXCEPTION WHEN OTHERS THEN
    RETURN format('%s: %s', SQLSTATE, SQLERRM);
END
$$;
SELECT * FROM sync.check();
SELECT upload(1);

-- known() reads app.sites, which the route may not read: every upload fails, and sync.check()
-- says why, with the GRANT.
CREATE FUNCTION app.known(device uuid) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_build_object('device', d.id, 'site', s.id)
            FROM app.devices d JOIN app.sites s ON s.id = d.site
            WHERE d.id = device AND d.active AND s.open);
END
$$;
SELECT sync.senders(known => 'app.known(uuid)');
SELECT upload(2);
SELECT * FROM sync.check();
SELECT fix FROM sync.check() \gexec
SELECT * FROM sync.check();
SELECT upload(2);
SELECT device, n FROM app.readings ORDER BY n;

-- known() the route may not execute.
REVOKE EXECUTE ON FUNCTION app.known(uuid) FROM PUBLIC;
SELECT upload(3);
SELECT * FROM sync.check();
SELECT fix FROM sync.check() \gexec
SELECT * FROM sync.check();

-- filing() (an SQL-standard body) writes app.visits, which the route may not, and counts the
-- visit in app.sites, which it may read but not update: both are named, in the order met.
CREATE FUNCTION app.note_visit(known jsonb) RETURNS void LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO app.visits VALUES ((known->>'device')::uuid, (known->>'site')::int);
    UPDATE app.sites SET visits = visits + 1 WHERE id = (known->>'site')::int;
END;
SELECT sync.senders(known => 'app.known(uuid)', filing => 'app.note_visit(jsonb)');
SELECT upload(3);
SELECT * FROM sync.check();
-- sync.check() ran the hooks but kept nothing of what they did.
SELECT (SELECT count(*) FROM app.visits) AS visits, (SELECT visits FROM app.sites) AS site_visits,
       has_table_privilege('hook_route', 'app.visits', 'INSERT') AS may_insert_visits,
       current_user = session_user AS own_role;
SELECT fix FROM sync.check() \gexec
SELECT * FROM sync.check();
SELECT upload(3);
SELECT (SELECT count(*) FROM app.visits) AS visits, (SELECT visits FROM app.sites) AS site_visits;
-- In a read-only transaction (a standby) the hooks cannot be run: that is said, not taken for
-- nothing to fix.
BEGIN TRANSACTION READ ONLY;
SELECT * FROM sync.check();
ROLLBACK;

-- A SECURITY DEFINER known() runs as its owner: the route needs only EXECUTE on it and USAGE on
-- its schema, not what it reads (here app.sites, taken back from the route).
CREATE SCHEMA hooks;
CREATE FUNCTION hooks.known(device uuid) RETURNS jsonb LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN (SELECT jsonb_build_object('device', d.id, 'site', s.id)
        FROM app.devices d JOIN app.sites s ON s.id = d.site WHERE d.id = device AND s.open);
REVOKE SELECT ON app.sites FROM hook_route;
SELECT sync.senders(known => 'hooks.known(uuid)');
SELECT upload(4);
SELECT * FROM sync.check();
SELECT fix FROM sync.check() \gexec
SELECT * FROM sync.check();
SELECT upload(4);
SELECT device, n FROM app.readings ORDER BY n;

-- What running the hooks cannot cure with a grant is said as it is: here known() fails for the
-- replica it is run for.
CREATE FUNCTION app.broken(device uuid) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'no site for %', device;
END
$$;
SELECT sync.senders(known => 'app.broken(uuid)');
SELECT * FROM sync.check();

\c regression
DROP DATABASE hook_grants_test;
DROP ROLE hook_route;
