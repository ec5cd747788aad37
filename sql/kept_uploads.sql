-- Kept uploads and their retry (docs/DESIGN.md §6, §13): what sync.receive could not file is kept, and
-- the relay's retry files it again as the route filed it (its role, its settings), answers it
-- once under its own upload id, backs off what the data may cure and leaves what only a change
-- can cure (a deploy, a declaration, a grant) until something changes. In its own database.
CREATE DATABASE kept_test;
\c kept_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA insp;
CREATE TABLE insp.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE insp.products (id int PRIMARY KEY, name text);
CREATE TABLE insp.sales (id int PRIMARY KEY);
CREATE TABLE insp.lines (sale_id int REFERENCES insp.sales, n int, qty int NOT NULL,
                         PRIMARY KEY (sale_id, n));
CREATE TABLE insp.visits (id int PRIMARY KEY, sale_id int REFERENCES insp.sales,
                          taken_at timestamptz, on_day date, lasted interval);
CREATE TABLE insp.secret (id int PRIMARY KEY, note text);
SELECT sync.replicas('insp.registers', 'registers', live => 'active');
SELECT sync.catalog('insp.products');
SELECT sync.record('insp.sales');
SELECT sync.record('insp.lines');
SELECT sync.record('insp.visits');
INSERT INTO insp.registers VALUES ('00000000-0000-0000-0000-0000000000a1');
SELECT provisioned FROM sync.pass();
-- The app's up route and its role.
CREATE ROLE kept_route IN ROLE sync_receiver;
GRANT USAGE ON SCHEMA insp TO kept_route;
GRANT SELECT, INSERT ON insp.sales, insp.lines, insp.visits TO kept_route;

CREATE FUNCTION up(id text, rows text, version int DEFAULT 1) RETURNS bytea LANGUAGE sql
AS $$ SELECT convert_to(format('{"v":%s,"id":"%s","rows":%s}', version, id, rows), 'UTF8') $$;
CREATE FUNCTION route(message bytea) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    status text;
BEGIN
    SET LOCAL ROLE kept_route;
    status := sync.receive('00000000-0000-0000-0000-0000000000a1', message);
    RESET ROLE;
    RETURN status;
END
$$;
-- What is kept, and what was answered.
CREATE VIEW kept AS
SELECT coalesce(s.table_name, '(the message)') AS t, s.key,
       CASE WHEN octet_length(s.body) > 120 THEN format('(%s bytes)', octet_length(s.body))
            ELSE convert_from(s.body, 'UTF8') END AS body, s.reason, s.tries
FROM sync.set_aside s WHERE s.kind = 'upload' ORDER BY s.id;
-- The same for bodies that are not text (an upload sent gzip).
CREATE VIEW kept_gzip AS
SELECT coalesce(s.table_name, '(the message)') AS t, s.body, s.reason, s.tries
FROM sync.set_aside s WHERE s.kind = 'upload' ORDER BY s.id;
CREATE VIEW answers AS
SELECT a.id, a.payload->>'upload' AS upload, e->>'t' AS t, e->'k' AS k, e->>'why' AS why
FROM sync.answer a LEFT JOIN LATERAL jsonb_array_elements(a.payload->'kept') WITH ORDINALITY AS x(e, i) ON true
ORDER BY a.id, x.i;

-- One upload, filed by the route under its own settings (New York time, day-first dates, SQL
-- standard intervals): a line and a visit of a sale the server does not have yet (a foreign
-- key: data may cure it), a line whose quantity is not a number, a catalog row, and a row of a
-- table that is not declared yet (only a change cures those). Visit 2 is filed at once.
SET TimeZone = 'America/New_York';
SET DateStyle = 'ISO, DMY';
SET IntervalStyle = 'sql_standard';
SELECT route(up('10000000-0000-0000-0000-000000000001', $$[
  {"t":"insp.lines","r":{"sale_id":1,"n":1,"qty":2}},
  {"t":"insp.lines","r":{"sale_id":2,"n":1,"qty":"two"}},
  {"t":"insp.products","r":{"id":1,"name":"free tea"}},
  {"t":"insp.secret","r":{"id":1,"note":"declared later"}},
  {"t":"insp.visits","r":{"id":1,"sale_id":1,"taken_at":"2026-12-01 10:00:00","on_day":"01/02/2026","lasted":"-1 2:03:04"}},
  {"t":"insp.visits","r":{"id":2,"taken_at":"2026-12-01 10:00:00","on_day":"01/02/2026","lasted":"-1 2:03:04"}}]$$));
RESET TimeZone;
RESET DateStyle;
RESET IntervalStyle;
SELECT * FROM kept;
SELECT * FROM answers;
-- The relay's report tells what waits for data (the sale a line references) from what needs a
-- fix (a type, a table not declared).
SELECT level, line FROM sync_internal.report() WHERE line LIKE 'set aside:%';

-- A retry with nothing changed: the rows the data may cure are tried again and kept again, the
-- others are not tried; nothing is answered again, no upload is added.
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT * FROM kept;
SELECT (SELECT count(*) FROM sync.answer) AS answers, (SELECT count(*) FROM sync.upload) AS uploads;
-- Right after, nothing is due: the tried ones are backed off (one retry_every), the others wait.
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT s.table_name, s.key, s.tries, s.next_try_at - s.last_try_at AS backoff
FROM sync.set_aside s ORDER BY s.id;
SELECT (SELECT count(*) FROM sync.answer) AS answers, (SELECT count(*) FROM sync.upload) AS uploads;

-- The sale comes, and the backoff passes: the retry files the line and the visit, under the
-- settings the route had (the visit is the same as visit 2, filed at once), and answers the
-- upload again under its own id with what is still kept of it.
INSERT INTO insp.sales VALUES (1);
UPDATE sync.set_aside SET next_try_at = now() - interval '1 second' WHERE next_try_at IS NOT NULL;
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SET TimeZone = 'UTC';
SELECT id, taken_at, on_day, lasted FROM insp.visits ORDER BY id;
RESET TimeZone;
SELECT * FROM insp.lines;
SELECT * FROM kept;
SELECT * FROM answers WHERE id > 1;
SELECT replica, id, kept FROM sync.upload;

-- insp.secret is declared, and the route may write it: that is a change, so everything kept is
-- tried again. The secret row is filed (under its own key now); the others are kept again.
SELECT sync.record('insp.secret');
GRANT SELECT, INSERT ON insp.secret TO kept_route;
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT * FROM insp.secret;
SELECT * FROM kept;
SELECT * FROM answers WHERE id > 2;
-- Another change that cures nothing: tried again, kept again, not answered again.
COMMENT ON TABLE insp.lines IS 'lines of a sale';
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT t, key, tries FROM kept;
SELECT count(*) AS answers FROM sync.answer;
DELETE FROM sync.set_aside;
TRUNCATE sync.answer;

-- A message kept whole because it was over magic_sync.max_upload_bytes, that speaks a later
-- protocol version: once the limit is back, the retry finds the version too new. That is its
-- reason, and it waits for a deploy; the retry does not stop at it.
SET magic_sync.max_upload_bytes = 1024;
SELECT route(up('10000000-0000-0000-0000-000000000002',
                '[{"t":"insp.secret","r":{"id":2,"note":"' || repeat('x', 2000) || '"}}]', 3));
RESET magic_sync.max_upload_bytes;
SELECT * FROM kept;
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT t, body, reason, tries FROM kept;
SELECT next_try_at IS NULL AS waits_for_a_change FROM sync.set_aside;
DELETE FROM sync.set_aside;
TRUNCATE sync.answer;

-- The same of protocol version 1: filed once the limit is raised, under its own id, and answered
-- with what was filed of it, which replaces "kept whole".
SET magic_sync.max_upload_bytes = 1024;
SELECT route(up('10000000-0000-0000-0000-000000000003',
                '[{"t":"insp.secret","r":{"id":3,"note":"' || repeat('x', 2000) || '"}},{"t":"insp.products","r":{"id":3}}]'));
RESET magic_sync.max_upload_bytes;
SELECT * FROM answers;
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT id, length(note) FROM insp.secret ORDER BY id;
SELECT t, key, reason, tries FROM kept;
SELECT * FROM answers;
SELECT kept FROM sync.upload WHERE id = '10000000-0000-0000-0000-000000000003';
DELETE FROM sync.set_aside;
TRUNCATE sync.answer;

-- The retry goes in slices, each at most as many items as asked; an upload is answered once,
-- when its last due item is done.
SELECT route(up('10000000-0000-0000-0000-000000000004', $$[
  {"t":"insp.lines","r":{"sale_id":5,"n":1,"qty":1}},
  {"t":"insp.lines","r":{"sale_id":5,"n":2,"qty":1}},
  {"t":"insp.lines","r":{"sale_id":5,"n":3,"qty":1}}]$$));
TRUNCATE sync.answer;
INSERT INTO insp.sales VALUES (5);
SELECT * FROM sync.retry_uploads(2);
SELECT count(*) AS answers FROM sync.answer;
SELECT * FROM sync.retry_uploads(2);
SELECT * FROM answers;
SELECT * FROM sync.retry_uploads(2);
DELETE FROM sync.set_aside;
TRUNCATE sync.answer;

-- A device one version ahead of the server sends a column the table lacks: the row is kept,
-- naming it, and filed, with it, once the column is deployed.
SELECT route(up('10000000-0000-0000-0000-000000000005', $$[
  {"t":"insp.sales","r":{"id":6,"discount":0.5}}]$$));
SELECT t, key, reason FROM kept;
SELECT * FROM answers;
ALTER TABLE insp.sales ADD COLUMN discount numeric;
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT * FROM insp.sales WHERE id = 6;
SELECT count(*) AS kept FROM kept;

-- What a replica may keep is bounded (magic_sync.max_kept_items, magic_sync.max_kept_bytes): an
-- upload that would keep more is refused whole, nothing of it filed or kept, and its id not taken,
-- so the device sends it again once there is room. The operator sees the refusals in sync.status.
DELETE FROM sync.set_aside;
TRUNCATE sync.answer;
SET magic_sync.max_kept_items = 2;
SET magic_sync.max_kept_bytes = '8kB';
SELECT route(up('10000000-0000-0000-0000-000000000006', $$[
  {"t":"insp.lines","r":{"sale_id":7,"n":1,"qty":1}},
  {"t":"insp.lines","r":{"sale_id":7,"n":2,"qty":1}}]$$));
-- A third kept row would be one too many: the sale filed beside it is not filed either.
SELECT route(up('10000000-0000-0000-0000-000000000007', $$[
  {"t":"insp.sales","r":{"id":8}},
  {"t":"insp.lines","r":{"sale_id":7,"n":3,"qty":1}}]$$));
-- So is a message kept whole.
SELECT route(convert_to('not an upload', 'UTF8'));
SELECT (SELECT count(*) FROM insp.sales WHERE id = 8) AS sale_8, (SELECT count(*) FROM kept) AS kept,
       (SELECT count(*) FROM sync.upload WHERE id = '10000000-0000-0000-0000-000000000007') AS upload_7;
-- An upload that keeps nothing is filed.
SELECT route(up('10000000-0000-0000-0000-000000000008', '[{"t":"insp.sales","r":{"id":9}}]'));
-- Bytes bound as well as items.
SET magic_sync.max_kept_items = 100;
SELECT route(up('10000000-0000-0000-0000-000000000009',
                '[{"t":"insp.lines","r":{"sale_id":7,"n":4,"qty":"' || repeat('x', 9000) || '"}}]'));
SELECT replica, set_aside, uploads_refused FROM sync.status;
SELECT refused, why FROM sync.upload_refusal;
-- Room made (what was kept is discarded): the refused upload sent again is filed.
DELETE FROM sync.set_aside;
SELECT route(up('10000000-0000-0000-0000-000000000007', $$[
  {"t":"insp.sales","r":{"id":8}},
  {"t":"insp.lines","r":{"sale_id":7,"n":3,"qty":1}}]$$));
SELECT (SELECT count(*) FROM insp.sales WHERE id = 8) AS sale_8, (SELECT count(*) FROM kept) AS kept;
RESET magic_sync.max_kept_items;
RESET magic_sync.max_kept_bytes;
SELECT name, setting, unit FROM pg_settings WHERE name LIKE 'magic_sync.max_kept%' ORDER BY name;

-- An upload may come gzip (docs/PROTOCOL.md §7): sync.receive tells it by its first bytes and
-- reads it as the JSON it holds. The bodies below are gzip(1)'s. A sale and its line, filed:
DELETE FROM sync.set_aside;
TRUNCATE sync.answer;
SELECT route('\x1f8b0800000000000203ab562a53b232d451ca4c51b252323280005d2c0414182ae92815e597172b5945572b9500f564e61517e81527e6a416836494acaac1461919d4d6ea2029c8c9cc432800a98e87a8d251ca035b5f585209e4d6d6c6d602009a1f8c4891000000'::bytea);
SELECT s.id, l.n, l.qty FROM insp.sales s JOIN insp.lines l ON l.sale_id = s.id WHERE s.id = 20;
-- What it holds is bound by magic_sync.max_upload_bytes once inflated (a kilobyte here, two
-- sent): kept whole as it came, answered under the id read from its start, and tried again
-- backed off (a raised bound may cure it); the retry files it once the bound is back.
SET magic_sync.max_upload_bytes = 1024;
SELECT route('\x1f8b0800000000000203ab562a53b232d451ca4c51b252323280005d2c04141829e92815e597172b5945572b9500f564e61517e81527e6a416836494acaac1461919d6d6ea202b484d2e4a2d4155a1a394975f920a5451310a46c1281805a360148c82210f946a6b636b01cf0ecf3659080000'::bytea);
RESET magic_sync.max_upload_bytes;
SELECT t, substr(body, 1, 2) = '\x1f8b' AS gzip, reason, tries FROM kept_gzip;
SELECT next_try_at IS NULL AS waits_for_a_change FROM sync.set_aside;
SELECT * FROM answers;
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT id, length(note) FROM insp.secret WHERE id = 21;
SELECT count(*) AS kept FROM sync.set_aside;
SELECT * FROM answers;
TRUNCATE sync.answer;
-- Compressed twice it is not read (a nest as deep as its bytes allow would be): kept whole, and it
-- waits for a change.
SELECT route('\x1f8b080000000000020393efe660000126e6d5615ac19b8cae049ef209dc146464d4c010abc32222a1fd5243f4e97471ed48d770eda90c5f539e898abf10557fb644ac3965ca9a5507dd2425af5e3b768d89612bf3fde7b1407300f883ae0f50000000'::bytea);
SELECT t, reason, tries FROM kept_gzip;
SELECT next_try_at IS NULL AS waits_for_a_change FROM sync.set_aside;
SELECT count(*) AS sale_22 FROM insp.sales WHERE id = 22;
DELETE FROM sync.set_aside;
TRUNCATE sync.answer;

\c regression
DROP DATABASE kept_test;
DROP ROLE kept_route;
