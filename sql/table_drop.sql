-- Tables that stop syncing under a name: renamed and declared again, sync.drop()ped, or dropped.
-- Every replica that holds some of their rows is told to drop the table (a protocol version 2
-- message), and the relay's state forgets them.
CREATE DATABASE table_drop_test;
\c table_drop_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA fleet;
CREATE TABLE fleet.vans (id uuid PRIMARY KEY, depot int, active bool NOT NULL DEFAULT true);
CREATE TABLE fleet.routes (id int PRIMARY KEY, depot int, name text);
CREATE TABLE fleet.tasks (id int PRIMARY KEY, van uuid, what text);
CREATE TABLE fleet.depots (id int PRIMARY KEY, city text);
SELECT sync.replicas('fleet.vans', 'vans', live => 'active');
SELECT sync.catalog('fleet.routes', "to" => 'depot = depot');
SELECT sync.both('fleet.tasks', "to" => 'van');
SELECT sync.catalog('fleet.depots');
INSERT INTO fleet.vans VALUES ('00000000-0000-0000-0000-000000000001', 1),
                              ('00000000-0000-0000-0000-000000000002', 2);
INSERT INTO fleet.routes VALUES (10, 1, 'north loop'), (11, 2, 'south loop');
INSERT INTO fleet.tasks VALUES (20, '00000000-0000-0000-0000-000000000001', 'deliver'),
                               (21, '00000000-0000-0000-0000-000000000002', 'collect');
INSERT INTO fleet.depots VALUES (1, 'Lyon'), (2, 'Lille');
SELECT provisioned FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
-- The unsent messages: version, tables dropped, and the rows they carry.
CREATE VIEW sent AS
SELECT o.replica, o.seq, m->'v' AS v, m->'drop_tables' AS drop_tables,
       (SELECT string_agg(format('%s %s %s', x->>'t', x->'k', coalesce(x->'r'->>'name', x->'r'->>'city', '-')),
                          '; ' ORDER BY c->>'scope', x->>'t', x->>'k')
        FROM jsonb_array_elements(m->'chunks') c, jsonb_array_elements(c->'rows') x) AS rows
FROM sync.outbox o
CROSS JOIN LATERAL (SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb AS m) x
WHERE o.sent_at IS NULL;
CREATE FUNCTION held(codec_name text) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM sync.row r JOIN sync.codec c ON c.id = r.codec WHERE c.table_name = codec_name
$$;

-- Renamed and declared again: the rows under the old name are dropped on every replica that held
-- them, and sent again under the new one; the old name leaves the relay's state.
ALTER TABLE fleet.routes RENAME TO van_routes;
SELECT declaration, problem FROM sync.check();
SELECT sync.catalog('fleet.van_routes', "to" => 'depot = depot');
SELECT table_name FROM sync.dropped_codec;
-- Until the next pass forgets the old name, the audit finds nothing either: a table that ended
-- is no drift of the relay's state.
SELECT * FROM sync.audit();
SELECT messages FROM sync.pass();
SELECT * FROM sent ORDER BY replica, seq;
SELECT count(*) AS old_rows FROM sync.row r WHERE NOT EXISTS (SELECT FROM sync.codec c WHERE c.id = r.codec);
SELECT held('fleet.van_routes') AS new_rows;
SELECT s.n, (sync_internal.scope_fingerprint(s.id)).n AS counted FROM sync.scope s WHERE s.match = 'depot' ORDER BY s.value;
-- Deleting a row now removes it under its new name.
UPDATE sync.outbox SET sent_at = now();
DELETE FROM fleet.van_routes WHERE id = 10;
SELECT rows_changed FROM sync.pass();
SELECT * FROM sent ORDER BY replica, seq;
UPDATE sync.outbox SET sent_at = now();

-- sync.drop(): every replica that held rows of the table drops it.
SELECT sync.drop('fleet.tasks');
SELECT messages FROM sync.pass();
SELECT * FROM sent ORDER BY replica, seq;
SELECT count(*) AS task_rows FROM sync.row r WHERE NOT EXISTS (SELECT FROM sync.codec c WHERE c.id = r.codec);
UPDATE sync.outbox SET sent_at = now();

-- DROP TABLE of a synced table: the same, with no declaration left behind.
DROP TABLE fleet.depots;
SELECT table_name FROM sync.codec ORDER BY 1;
SELECT * FROM sync.audit();
SELECT messages FROM sync.pass();
SELECT * FROM sent ORDER BY replica, seq;
SELECT * FROM sync.check();
SELECT * FROM sync.audit();

-- A change of a key column's type gives every row another key: the table is declared again by
-- itself, the rows under the old keys dropped and those under the new ones sent.
UPDATE sync.outbox SET sent_at = now();
ALTER TABLE fleet.van_routes ALTER COLUMN id TYPE text;
SELECT table_name, key_types FROM sync.codec ORDER BY 1;
SELECT messages FROM sync.pass();
SELECT * FROM sent ORDER BY replica, seq;
SELECT * FROM sync.audit();

-- Tables dropped by the dozen under a small limit: the drops go in as many messages as it takes,
-- each within bytes_per_message, rows only with the last of them, each table dropped once, in
-- order.
UPDATE sync.outbox SET sent_at = now();
SET magic_sync.bytes_per_message = 1104;
DO $$
BEGIN
    FOR i IN 1..30 LOOP
        EXECUTE format('CREATE TABLE fleet.%I (id int PRIMARY KEY)', 'a_rather_long_table_name_number_' || i);
        EXECUTE format('INSERT INTO fleet.%I VALUES (1)', 'a_rather_long_table_name_number_' || i);
        PERFORM sync.catalog(format('fleet.%I', 'a_rather_long_table_name_number_' || i));
    END LOOP;
END
$$;
SELECT messages > 0 AS sent FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
SELECT count(sync.drop(format('fleet.%I', 'a_rather_long_table_name_number_' || i))) AS dropped
FROM generate_series(1, 30) i;
INSERT INTO fleet.van_routes VALUES ('12', 1, 'east loop');
SELECT messages FROM sync.pass();
SELECT messages FROM sync.pass();
WITH m AS (SELECT s.replica, s.seq, octet_length(sync.message(s.replica, s.seq)) AS bytes,
                  s.drop_tables, s.rows FROM sent s)
SELECT m.replica, count(*) AS messages, max(m.bytes) <= 1024 AS within_limit,
       sum(jsonb_array_length(coalesce(m.drop_tables, '[]'))) AS tables_dropped,
       string_agg(m.rows, '; ') AS rows,
       bool_and(m.rows IS NULL OR m.seq >= (SELECT max(d.seq) FROM m d
                                            WHERE d.replica = m.replica AND d.drop_tables IS NOT NULL))
           AS rows_after_drops,
       (SELECT array_agg(t ORDER BY d.seq, x.n) FROM m d,
               jsonb_array_elements_text(d.drop_tables) WITH ORDINALITY AS x(t, n) WHERE d.replica = m.replica)
       = (SELECT array_agg(t ORDER BY t) FROM (SELECT DISTINCT jsonb_array_elements_text(d.drop_tables) AS t
                                               FROM m d WHERE d.replica = m.replica) u) AS once_in_order
FROM m GROUP BY m.replica ORDER BY 1;
SELECT id, pending_table_drops FROM sync.replica ORDER BY 1;
RESET magic_sync.bytes_per_message;

\c regression
DROP DATABASE table_drop_test;
