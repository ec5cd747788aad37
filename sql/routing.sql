-- Routing: a declaration grouped on a replicas column that no earlier declaration used reaches
-- the replicas that exist already, as does one on a column added to the replicas table later.
CREATE DATABASE routing_test;
\c routing_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE TABLE vans (id uuid PRIMARY KEY, name text, active bool NOT NULL DEFAULT true);
SELECT sync.replicas('public.vans', 'vans', live => 'active');
INSERT INTO vans VALUES ('00000000-0000-0000-0000-000000000001', 'v1'),
                        ('00000000-0000-0000-0000-000000000002', 'v2');
SELECT provisioned FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
-- What each van's unsent messages carry, one line per row.
CREATE VIEW carried AS
SELECT v.name AS van, c->>'scope' AS scope, x->>'t' AS t, x->'k' AS k, x->'r' AS r
FROM sync.outbox o JOIN vans v ON v.id = o.replica
CROSS JOIN LATERAL jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c
CROSS JOIN LATERAL jsonb_array_elements(c->'rows') x
WHERE o.sent_at IS NULL;

CREATE TABLE notes (id int PRIMARY KEY, van_name text);
SELECT sync.catalog('public.notes', "to" => 'van_name = name');
INSERT INTO notes VALUES (1, 'v1'), (2, 'v2'), (3, 'v9');
SELECT provisioned, messages FROM sync.pass();
SELECT * FROM carried ORDER BY van, k::text;
SELECT v.name, sync_internal.scope_name(s.match, s.value, s.partition) AS scope
FROM sync.member m JOIN sync.scope s ON s.id = m.scope JOIN vans v ON v.id = m.replica
WHERE s.match = 'name' ORDER BY 1;
UPDATE sync.outbox SET sent_at = now();

-- A column added to the replicas table later, then grouped on.
ALTER TABLE vans ADD COLUMN shift int;
UPDATE vans SET shift = 1 WHERE name = 'v1';
UPDATE vans SET shift = 2 WHERE name = 'v2';
SELECT FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
CREATE TABLE rosters (id int PRIMARY KEY, shift int, who text);
INSERT INTO rosters VALUES (10, 1, 'ann'), (11, 2, 'bob');
SELECT sync.catalog('public.rosters', "to" => 'shift = shift');
SELECT messages FROM sync.pass();
SELECT van, scope, t, k FROM carried ORDER BY van, k::text;
UPDATE sync.outbox SET sent_at = now();

-- Dropping the last declaration grouped on a column: the replicas leave those scopes.
SELECT sync.drop('public.rosters');
SELECT messages FROM sync.pass();
SELECT v.name, m->'drop' AS dropped, m->'drop_tables' AS dropped_tables
FROM sync.outbox o JOIN vans v ON v.id = o.replica
CROSS JOIN LATERAL (SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb AS m) x
WHERE o.sent_at IS NULL ORDER BY 1;
SELECT * FROM sync.audit();

\c regression
DROP DATABASE routing_test;
