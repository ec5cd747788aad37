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

-- A change of the replicas relation looks at every replica again: here who is live.
ALTER TABLE insp.inspectors ADD COLUMN retired bool NOT NULL DEFAULT false;
SELECT codec, key FROM sync.note;
SELECT sync.replicas('insp.inspectors', 'inspectors', live => 'active AND NOT retired');
UPDATE insp.inspectors SET retired = true;
SELECT forgotten FROM sync.pass();
SELECT * FROM sync.audit();

\c regression
DROP DATABASE schema_change_test;
