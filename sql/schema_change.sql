-- Schema changes reach every row: a change of a synced table's columns plans the whole table
-- again, sending only the rows whose canonical form changed.
CREATE DATABASE schema_change_test;
\c schema_change_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA insp;
CREATE TABLE insp.inspectors (id uuid PRIMARY KEY, active bool NOT NULL DEFAULT true);
CREATE TABLE insp.sites (id int PRIMARY KEY, name varchar(40), addr text, score numeric);
SELECT sync.replicas('insp.inspectors', 'inspectors', live => 'active');
SELECT sync.catalog('insp.sites');
INSERT INTO insp.inspectors VALUES ('00000000-0000-0000-0000-000000000001');
INSERT INTO insp.sites VALUES (1, 'mill', '1 Main St', 4.50), (2, 'dock', NULL, 3);
SELECT provisioned FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
-- The rows the unsent messages carry.
CREATE VIEW carried AS
SELECT x->'k' AS k, x->'r' AS r
FROM sync.outbox o,
     jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c,
     jsonb_array_elements(c->'rows') x
WHERE o.sent_at IS NULL;

-- A column added with a default: every row has it now, and every replica gets it.
ALTER TABLE insp.sites ADD COLUMN weight numeric DEFAULT 2.5;
SELECT codec, key FROM sync.note;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text;
UPDATE sync.outbox SET sent_at = now();
-- A column dropped: gone from every row on the replicas too.
ALTER TABLE insp.sites DROP COLUMN addr;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text;
UPDATE sync.outbox SET sent_at = now();
-- A column renamed: every row in one shape.
ALTER TABLE insp.sites RENAME COLUMN weight TO load;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text;
UPDATE sync.outbox SET sent_at = now();
-- A type changed: the rows whose canonical form it changed travel, the others do not.
ALTER TABLE insp.sites ALTER COLUMN score TYPE int USING round(score)::int;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text;
UPDATE sync.outbox SET sent_at = now();
ALTER TABLE insp.sites ALTER COLUMN name TYPE text;
SELECT rows_changed FROM sync.pass();
-- A change that leaves the columns as they were plans nothing.
ALTER TABLE insp.sites ADD CONSTRAINT named CHECK (name <> '');
CREATE INDEX sites_name ON insp.sites (name);
SELECT count(*) AS notes FROM sync.note;

-- A change of a type a synced column uses, however deep (through a domain, an array, a range, a
-- composite inside a composite), plans every table that uses it again, as a column change does:
-- an enum's value renamed, a composite's attribute added or renamed.
CREATE TYPE insp.state AS ENUM ('open', 'fault');
CREATE TYPE insp.spot AS (x int, y int);
CREATE DOMAIN insp.states AS insp.state[];
CREATE TYPE insp.span AS RANGE (subtype = insp.state);
CREATE TYPE insp.visit AS (spot insp.spot, states insp.states);
CREATE TABLE insp.checks (id int PRIMARY KEY, state insp.state, spot insp.spot, span insp.span);
CREATE TABLE insp.visits (id int PRIMARY KEY, visit insp.visit);
CREATE TABLE insp.others (id int PRIMARY KEY, note text);
SELECT sync.catalog('insp.checks'), sync.catalog('insp.visits'), sync.catalog('insp.others');
INSERT INTO insp.checks VALUES (1, 'fault', '(1,2)', '[open,fault]'), (2, 'open', NULL, NULL);
INSERT INTO insp.visits VALUES (1, ROW('(3,4)', '{open,fault}')), (2, NULL);
INSERT INTO insp.others VALUES (1, 'untouched');
SELECT rows_changed FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
CREATE VIEW noted AS
SELECT c.table_name, n.key FROM sync.note n JOIN sync.codec c ON c.id = n.codec ORDER BY 1;
ALTER TYPE insp.state RENAME VALUE 'fault' TO 'broken';
SELECT * FROM noted;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text, r::text;
UPDATE sync.outbox SET sent_at = now();
ALTER TYPE insp.spot ADD ATTRIBUTE z int;
SELECT * FROM noted;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text, r::text;
UPDATE sync.outbox SET sent_at = now();
ALTER TYPE insp.spot RENAME ATTRIBUTE x TO east;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text, r::text;
UPDATE sync.outbox SET sent_at = now();
-- A table's row type held by a synced column: an ALTER TABLE of that table plans it again too.
CREATE TABLE insp.kinds (a int, b int);
CREATE TABLE insp.holds (id int PRIMARY KEY, kind insp.kinds);
SELECT sync.catalog('insp.holds');
INSERT INTO insp.holds VALUES (1, ROW(1, 2));
SELECT rows_changed FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
ALTER TABLE insp.kinds RENAME COLUMN a TO first;
SELECT * FROM noted;
SELECT rows_changed FROM sync.pass();
SELECT * FROM carried ORDER BY k::text, r::text;
UPDATE sync.outbox SET sent_at = now();
-- A value added to an enum changes no row: the tables are looked at again, nothing travels.
ALTER TYPE insp.state ADD VALUE 'closed';
SELECT rows_changed FROM sync.pass();
-- An enum in a key: a value renamed changes the keys of the rows that hold it, so the table is
-- declared anew (as a key column's type change is): every replica drops the old rows and gets
-- them under the new keys.
CREATE TABLE insp.levels (state insp.state PRIMARY KEY, label text);
SELECT sync.catalog('insp.levels');
INSERT INTO insp.levels VALUES ('open', 'fine'), ('broken', 'call');
SELECT rows_changed FROM sync.pass();
UPDATE sync.outbox SET sent_at = now();
ALTER TYPE insp.state RENAME VALUE 'broken' TO 'faulty';
SELECT rows_changed FROM sync.pass();
SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'drop_tables' AS drop_tables
FROM sync.outbox o WHERE o.sent_at IS NULL;
SELECT * FROM carried ORDER BY k::text, r::text;
UPDATE sync.outbox SET sent_at = now();
SELECT * FROM sync.audit();

-- A change of the replicas relation looks at every replica again: here who is live.
ALTER TABLE insp.inspectors ADD COLUMN retired bool NOT NULL DEFAULT false;
SELECT codec, key FROM sync.note;
SELECT sync.replicas('insp.inspectors', 'inspectors', live => 'active AND NOT retired');
UPDATE insp.inspectors SET retired = true;
SELECT forgotten FROM sync.pass();
SELECT * FROM sync.audit();

\c regression
DROP DATABASE schema_change_test;
