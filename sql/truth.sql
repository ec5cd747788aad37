-- Truth, not bookkeeping: what a replica must hold, from the declarations and the tables alone
-- (sync.expected), and the audit that holds the relay's state against them (sync.audit).
CREATE DATABASE truth_test;
\c truth_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
SET TimeZone = 'UTC';
CREATE SCHEMA fleet;
CREATE TABLE fleet.vans (id uuid PRIMARY KEY, name text NOT NULL, depot int,
                         active boolean NOT NULL DEFAULT true);
CREATE TABLE fleet.depots (id int PRIMARY KEY, city text);
CREATE TABLE fleet.routes (id int PRIMARY KEY, depot int, stops text[], note text);
CREATE TABLE fleet.tasks (id int PRIMARY KEY, van uuid, what text, payload jsonb, photo bytea,
                          due timestamptz);
CREATE TABLE fleet.fuel (id int PRIMARY KEY, van uuid, litres numeric);
SELECT sync.replicas('fleet.vans', 'vans', live => 'active');
SELECT sync.catalog('fleet.depots');
SELECT sync.catalog('fleet.routes', "to" => 'depot = depot', columns => ARRAY['id', 'depot', 'stops']);
SELECT sync.both('fleet.tasks', "to" => 'van', replica_columns => ARRAY['what']);
SELECT sync.record('fleet.fuel');
-- The rule is parsed once, at declaration.
SELECT table_name, "to", audience, to_column, replica_column FROM sync.codec ORDER BY table_name;
INSERT INTO fleet.vans VALUES ('00000000-0000-0000-0000-000000000001', 'v1', 1),
                              ('00000000-0000-0000-0000-000000000002', 'v2', 2),
                              ('00000000-0000-0000-0000-000000000003', 'v3', 1);
UPDATE fleet.vans SET active = false WHERE name = 'v3';
INSERT INTO fleet.depots VALUES (1, 'Lyon'), (2, 'O''Hare "north"'), (3, NULL);
INSERT INTO fleet.routes VALUES (10, 1, '{a,b}', 'hidden'), (11, 2, '{c}', NULL),
                                (12, NULL, '{}', NULL);
INSERT INTO fleet.tasks VALUES
    (20, '00000000-0000-0000-0000-000000000001', E'deliver\nthe café', '{"weight": 2.50}', '\x00ff',
     '2026-12-03 10:00:00+01'),
    (21, '00000000-0000-0000-0000-000000000002', 'collect', NULL, NULL, NULL),
    (22, '00000000-0000-0000-0000-000000000009', 'nobody''s', NULL, NULL, NULL);
INSERT INTO fleet.fuel VALUES (30, '00000000-0000-0000-0000-000000000001', 40.5);

-- What each van must hold: the depots (to all), the routes of its depot (without the columns that
-- do not travel), its own tasks; never the fuel it sends up (record, to nobody).
SELECT * FROM sync.expected('00000000-0000-0000-0000-000000000001');
SELECT table_name, key, scope FROM sync.expected('00000000-0000-0000-0000-000000000002');
-- A van that is not live, and one nobody lists, must hold nothing.
SELECT count(*) FROM sync.expected('00000000-0000-0000-0000-000000000003');
SELECT count(*) FROM sync.expected('00000000-0000-0000-0000-000000000009');
-- The routing rule's one owner, as SQL over a row and a replica.
SELECT c.table_name, sync.audience_sql(c.id, 'row', 'replica') FROM sync.codec c ORDER BY 1;

-- Once the relay planned, what it plans for each van is exactly what the oracle says, row for row.
SELECT notes > 0 AS planned FROM sync.pass();
CREATE FUNCTION planned(replica uuid) RETURNS TABLE (t text, k text, h text, scope text)
LANGUAGE sql AS $$
    SELECT c.table_name, sync_internal.canonical(r.key), encode(r.hash, 'hex'),
           sync_internal.scope_name(s.match, s.value, s.partition)
    FROM sync.row r JOIN sync.member m ON m.scope = r.scope AND m.replica = planned.replica
    JOIN sync.scope s ON s.id = r.scope JOIN sync.codec c ON c.id = r.codec
    WHERE NOT r.gone AND NOT r.withheld
$$;
CREATE FUNCTION differences(replica uuid) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM ((SELECT table_name, key, h, scope FROM sync.expected(replica) WHERE NOT withheld
                           EXCEPT SELECT * FROM planned(replica))
                          UNION ALL
                          (SELECT * FROM planned(replica)
                           EXCEPT SELECT table_name, key, h, scope FROM sync.expected(replica))) d
$$;
SELECT differences('00000000-0000-0000-0000-000000000001') AS v1, differences('00000000-0000-0000-0000-000000000002') AS v2;

-- A row too big for any message is withheld by both, and left out of both fingerprints.
SET magic_sync.bytes_per_message = 1280;
INSERT INTO fleet.depots VALUES (4, repeat('z', 1200));
SELECT key, withheld FROM sync.expected('00000000-0000-0000-0000-000000000001') WHERE table_name = 'fleet.depots';
SELECT set_aside FROM sync.pass();
SELECT r.key, r.withheld FROM sync.row r JOIN sync.codec c ON c.id = r.codec
WHERE c.table_name = 'fleet.depots' ORDER BY r.key;
SELECT s.n, (sync_internal.scope_fingerprint(s.id)).n AS counted FROM sync.scope s WHERE s.match = '*';

-- The audit finds nothing while the state is the tables'...
SELECT * FROM sync.audit();
-- ...nor while a change is still noted and not planned: both sides leave its key out.
UPDATE fleet.depots SET city = 'Lille' WHERE id = 1;
SELECT * FROM sync.audit();
SELECT rows_changed FROM sync.pass();

-- A bookkeeping fault: a row's planned version is not its table's (as when a change was lost)
-- and a scope's running fingerprint was damaged. The audit says so, and plans them again from the
-- tables: the scope is counted again, the table noted whole, and the van gets the row.
WITH lost AS (
    UPDATE sync.row r SET body = '{"city":"Paris","id":1}', hash = sync_internal.row_hash('{"city":"Paris","id":1}')
    FROM sync.codec c, sync.row old
    WHERE c.id = r.codec AND c.table_name = 'fleet.depots' AND r.key = '{"id": 1}'
      AND old.k = r.k AND old.scope = r.scope
    RETURNING r.scope, r.k, old.hash AS was, r.hash AS now)
UPDATE sync.scope s SET fp = sync_internal.fp_add(sync_internal.fp_sub(s.fp, sync_internal.fp_element(l.k, l.was)),
                                         sync_internal.fp_element(l.k, l.now))
FROM lost l WHERE s.id = l.scope;
UPDATE sync.scope SET fp = sync_internal.fp_zero() WHERE match = 'depot' AND value = '2';
-- Its replicas had reported it at its head with the damaged fingerprint: their reports matched
-- it then (settled). Counted again, the scope may differ from them: they are looked at again.
INSERT INTO sync.holding (replica, scope, through, fp, n, settled)
SELECT m.replica, 'depot=2', s.head, s.fp, s.n, true
FROM sync.member m JOIN sync.scope s ON s.id = m.scope WHERE s.match = 'depot' AND s.value = '2';
UPDATE sync.outbox SET sent_at = now();
SELECT * FROM sync.audit();
SELECT codec, key FROM sync.note ORDER BY codec;
SELECT sync_internal.scope_name(s.match, s.value, s.partition) AS drifted
FROM sync.drifted_scope d JOIN sync.scope s ON s.id = d.scope;
SELECT rows_changed FROM sync.pass();
SELECT replica, scope, settled FROM sync.holding;
DELETE FROM sync.holding;
SELECT count(*) AS drifted FROM sync.drifted_scope;
SELECT * FROM sync.audit();
SELECT DISTINCT x->>'t' AS t, x->'k' AS k, x->'r'->>'city' AS city
FROM sync.outbox o,
     jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c,
     jsonb_array_elements(c->'rows') x
WHERE o.sent_at IS NULL AND o.replica = '00000000-0000-0000-0000-000000000001';

-- A membership fault: van 1 lost its cursor in its depot's scope. The audit says it belongs there,
-- and the pass brings it back in.
DELETE FROM sync.member m USING sync.scope s
WHERE s.id = m.scope AND m.replica = '00000000-0000-0000-0000-000000000001' AND s.match = 'depot';
SELECT * FROM sync.audit();
SELECT provisioned FROM sync.pass();
SELECT * FROM sync.audit();

-- sync.status says in sync only when it proves it: van 1 reports every scope at its head with
-- the server's fingerprint, but it lacks the depot withheld as too big (outside the fingerprints
-- on both sides)...
UPDATE sync.outbox SET sent_at = now();
INSERT INTO sync.holding (replica, scope, through, fp, n)
SELECT m.replica, sync_internal.scope_name(s.match, s.value, s.partition), s.head, s.fp, s.n
FROM sync.member m JOIN sync.scope s ON s.id = m.scope
WHERE m.replica = '00000000-0000-0000-0000-000000000001';
SELECT replica, state, lacks, lacks_why FROM sync.status ORDER BY replica;
-- ...until the row fits again and it reports the scope with it.
UPDATE fleet.depots SET city = 'Caen' WHERE id = 4;
SELECT rows_changed FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
UPDATE sync.holding h SET through = s.head, fp = s.fp, n = s.n
FROM sync.scope s
WHERE h.replica = '00000000-0000-0000-0000-000000000001'
  AND h.scope = sync_internal.scope_name(s.match, s.value, s.partition);
SELECT replica, state, lacks, lacks_why FROM sync.status ORDER BY replica;
-- ...but not when it is missing from a scope the declarations give it, whatever the relay's
-- own records say...
DELETE FROM sync.member m USING sync.scope s
WHERE s.id = m.scope AND m.replica = '00000000-0000-0000-0000-000000000001' AND s.match = 'depot';
DELETE FROM sync.holding WHERE scope LIKE 'depot=%';
SELECT replica, state, lacks, lacks_why FROM sync.status ORDER BY replica;
SELECT replica, problem FROM sync.audit();
SELECT provisioned FROM sync.pass();
INSERT INTO sync.holding (replica, scope, through, fp, n)
SELECT m.replica, sync_internal.scope_name(s.match, s.value, s.partition), s.head, s.fp, s.n
FROM sync.member m JOIN sync.scope s ON s.id = m.scope
WHERE m.replica = '00000000-0000-0000-0000-000000000001'
ON CONFLICT (replica, scope) DO UPDATE SET through = excluded.through, fp = excluded.fp, n = excluded.n;
SELECT replica, state, lacks, lacks_why FROM sync.status ORDER BY replica;
-- ...nor while an audit found one of its scopes drifted and the relay has not counted it again.
INSERT INTO sync.drifted_scope SELECT id FROM sync.scope WHERE match = '*';
SELECT replica, state, lacks, lacks_why FROM sync.status ORDER BY replica;
SELECT FROM sync.pass();
SELECT replica, state, lacks, lacks_why FROM sync.status ORDER BY replica;
-- Each state says its figures and what to do in one sentence (seconds shown as N here).
SELECT replica, state, regexp_replace(state_detail, '[0-9]+ s\M', 'N s', 'g') AS state_detail
FROM sync.status ORDER BY replica;
-- A replica that is no longer live is forgotten: nothing is sent to it; its device keeps what it
-- held.
UPDATE fleet.vans SET active = false WHERE id = '00000000-0000-0000-0000-000000000002';
SELECT forgotten FROM sync.pass();
SELECT replica, state, state_detail FROM sync.status ORDER BY replica;
UPDATE fleet.vans SET active = true WHERE id = '00000000-0000-0000-0000-000000000002';
SELECT provisioned FROM sync.pass();

-- A row's canonical form depends on no session's settings: a timestamptz key written from
-- sessions in two time zones is one row, its update and its delete found by one key.
CREATE TABLE fleet.shifts (starts timestamptz PRIMARY KEY, who text, length interval, rate float8);
SELECT sync.catalog('fleet.shifts');
SET TimeZone = 'America/New_York';
SET IntervalStyle = 'iso_8601';
SET extra_float_digits = 0;
INSERT INTO fleet.shifts VALUES ('2026-12-03 08:00:00+00', 'ann', '8 hours', 0.1);
SELECT rows_changed FROM sync.pass();
SET TimeZone = 'Asia/Tokyo';
UPDATE fleet.shifts SET who = 'bob';
SELECT rows_changed FROM sync.pass();
SELECT r.key, r.body, r.gone FROM sync.row r JOIN sync.codec c ON c.id = r.codec
WHERE c.table_name = 'fleet.shifts';
SELECT key, "row" FROM sync.expected('00000000-0000-0000-0000-000000000001') WHERE table_name = 'fleet.shifts';
SELECT * FROM sync.audit();
SET TimeZone = 'America/New_York';
DELETE FROM fleet.shifts;
SELECT rows_changed FROM sync.pass();
SELECT r.key, r.gone FROM sync.row r JOIN sync.codec c ON c.id = r.codec
WHERE c.table_name = 'fleet.shifts';
RESET IntervalStyle;
RESET extra_float_digits;
SET TimeZone = 'UTC';
-- Nor on DateStyle: dates, timestamps and their ranges travel in ISO form whatever the session's
-- (or the database's) DateStyle, and an audit from a session with another one finds no drift.
SET DateStyle = 'SQL, DMY';
CREATE TABLE fleet.days (day date PRIMARY KEY, at timestamp, span tsrange);
SELECT sync.catalog('fleet.days');
INSERT INTO fleet.days VALUES ('2024-01-02', '2024-01-02 10:00', '[2024-01-02 10:00,infinity)');
SELECT rows_changed FROM sync.pass();
SELECT r.key, r.body FROM sync.row r JOIN sync.codec c ON c.id = r.codec
WHERE c.table_name = 'fleet.days';
SELECT key, "row" FROM sync.expected('00000000-0000-0000-0000-000000000001') WHERE table_name = 'fleet.days';
SET DateStyle = 'German';
SELECT * FROM sync.audit();
RESET DateStyle;
-- A column may be named like an alias of the SQL we generate: a row is never referred to by a
-- bare alias that a column of the same name would capture.
CREATE TABLE fleet.marks (id int PRIMARY KEY, t text, e text, a text, n text, x text, kp text);
SELECT sync.catalog('fleet.marks');
INSERT INTO fleet.marks VALUES (1, 'tee', 'ee', 'ay', 'en', 'ex', 'kaypee');
SELECT rows_changed FROM sync.pass();
SELECT r.key, r.body FROM sync.row r JOIN sync.codec c ON c.id = r.codec
WHERE c.table_name = 'fleet.marks';
SELECT key, "row" FROM sync.expected('00000000-0000-0000-0000-000000000001') WHERE table_name = 'fleet.marks';
SELECT * FROM sync.audit();

\c regression
DROP DATABASE truth_test;
