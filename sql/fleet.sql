-- sync.fleet(): the fleet page's document (magic-sync-sender --metrics, GET /fleet.json). Three
-- replicas: one took its message and has not confirmed it, one failed (its error written by the
-- outside, kept as it is), one waits for its message; things set aside, each kind with its fix.
-- The sender's role reads it, and nothing behind it.
CREATE DATABASE fleet_test;
-- A backoff that lasts the test: the failed replica is still backing off when it is read.
ALTER DATABASE fleet_test SET magic_sync.backoff = '1h';
ALTER DATABASE fleet_test SET magic_sync.backoff_max = '1h';
\c fleet_test
CREATE EXTENSION magic_sync;
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL);
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products');
INSERT INTO shop.registers VALUES ('00000000-0000-0000-0000-0000000000a1'),
    ('00000000-0000-0000-0000-0000000000a2'), ('00000000-0000-0000-0000-0000000000a3');
INSERT INTO shop.products VALUES (1, 'tea');
SELECT provisioned, messages FROM sync.pass();
-- Before any delivery: all three catching up, no relay running here.
SELECT s->>'state' AS state, s->'replicas' AS replicas
FROM jsonb_array_elements(sync.fleet()->'states') s;
CREATE ROLE fleet_sender IN ROLE sync_sender;
SET ROLE fleet_sender;
SELECT sync.sent('00000000-0000-0000-0000-0000000000a1', 1);
SELECT sync.failed('00000000-0000-0000-0000-0000000000a2', 1, true,
                   E'HTTP 503: <img src=x onerror=alert(1)> "cut"\n', NULL);
-- The worst state first; figures of time as N.
SELECT d->>'replica' AS replica, d->>'state' AS state, d->'outbox' AS outbox,
       d->'last_error' AS last_error,
       regexp_replace(d->>'state_detail', '[0-9]+(\.[0-9]+)? s', 'N s', 'g') AS state_detail
FROM jsonb_array_elements(sync.fleet()->'slowest') d;
SELECT s->>'state' AS state, s->'replicas' AS replicas
FROM jsonb_array_elements(sync.fleet()->'states') s;
SELECT jsonb_array_length(sync.fleet(1)->'slowest') AS one, sync.fleet(1)->'slowest'->0->>'state' AS worst,
       sync.fleet()->'replicas' AS replicas, sync.fleet()->'unsent' AS unsent;
SELECT a->>'level' AS level, a->>'line' AS line FROM jsonb_array_elements(sync.fleet()->'alarms') a;
SELECT sync.fleet()->'relay'->'running' AS relay_running, sync.fleet()->'set_aside' AS set_aside;
-- Not what it reads.
SELECT count(*) FROM sync.status;
RESET ROLE;
-- Set aside, one of each kind (an upload that waits for data and one that waits for a fix).
INSERT INTO sync.set_aside (kind, codec, key, reason)
SELECT 'note', c.id, '{"id": 2}', 'division by zero' FROM sync.codec c;
INSERT INTO sync.set_aside (kind, codec, key, reason)
SELECT 'row', c.id, '{"id": 3}', 'too big' FROM sync.codec c;
INSERT INTO sync.set_aside (kind, replica, codec, key, reason)
SELECT 'untaken', '00000000-0000-0000-0000-0000000000a1', c.id, '{"id": 1}', 'no such column' FROM sync.codec c;
INSERT INTO sync.set_aside (kind, replica, reason, upload, table_name, next_try_at)
VALUES ('upload', '00000000-0000-0000-0000-0000000000a2', 'violates foreign key', gen_random_uuid(),
        'shop.sales', now()),
       ('upload', '00000000-0000-0000-0000-0000000000a2', 'permission denied', gen_random_uuid(),
        'shop.sales', NULL);
SET ROLE fleet_sender;
SELECT sync.fleet()->'set_aside'->'items' AS items;
SELECT k->>'kind' AS kind, k->'items' AS items, k->>'first_reason' AS first_reason, k->>'fix' AS fix
FROM jsonb_array_elements(sync.fleet()->'set_aside'->'kinds') k;
SELECT l->>'kind' AS kind, l->>'replica' AS replica, l->>'table' AS "table", l->>'reason' AS reason,
       l->'tries' AS tries
FROM jsonb_array_elements(sync.fleet()->'set_aside'->'latest') l;
SELECT count(*) AS set_aside_alarms FROM jsonb_array_elements(sync.fleet()->'alarms') a
WHERE a->>'line' LIKE 'set aside:%';
RESET ROLE;
\c regression
DROP DATABASE fleet_test;
DROP ROLE fleet_sender;
