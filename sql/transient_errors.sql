-- Errors a retry cures (a cancel, a statement or lock timeout, a deadlock, a serialization
-- failure, out of memory: pg::is_transient) end the pass, or the filing, whole: it is tried again
-- and nothing is set aside for them. Only an error of the row itself sets it aside, with its
-- reason. A second session (dblink) holds a lock on a synced table, so that the pass, or
-- sync.receive, waits on it until a timeout or a cancel ends the wait.
CREATE DATABASE transient_test;
\c transient_test
CREATE EXTENSION magic_sync;
CREATE EXTENSION dblink;
\set SHOW_CONTEXT never
CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE products (id int PRIMARY KEY, doc jsonb);
CREATE TABLE sales (id int PRIMARY KEY, qty int NOT NULL CONSTRAINT qty_is_small CHECK (qty < 10));
SELECT sync.replicas('registers', 'registers', live => 'active');
SELECT sync.catalog('products');
SELECT sync.record('sales');
INSERT INTO registers VALUES ('00000000-0000-0000-0000-000000000001');
SELECT provisioned FROM sync.pass();
SELECT dblink_connect('holder', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'),
    current_database()));
SELECT dblink_connect('canceller', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'),
    current_database()));
-- The products the relay planned.
CREATE VIEW planned AS
SELECT r.key->>'id' AS id FROM sync.row r JOIN sync.codec c ON c.id = r.codec
WHERE c.table_name = 'public.products' ORDER BY 1;

-- Two products, and a third nested deeper than a row may be: it cannot be encoded, ever.
INSERT INTO products VALUES (1, '{"a": 1}'), (2, '[2]'),
    (3, (repeat('[', 59) || repeat(']', 59))::jsonb);
SELECT dblink_exec('holder', 'BEGIN');
SELECT dblink_exec('holder', 'LOCK TABLE products IN ACCESS EXCLUSIVE MODE');

-- A lock timeout while the pass reads the rows ends the pass: nothing is set aside, the notes
-- wait for the next pass.
SET lock_timeout = '100ms';
SELECT notes FROM sync.pass();
SELECT count(*) AS set_aside FROM sync.set_aside;
SELECT count(*) AS notes_waiting FROM sync.note;

-- So does a statement timeout. (The lock timeout is there only so that a pass that caught the
-- cancel and carried on could not wait for the lock for ever.)
SET statement_timeout = '100ms';
SET lock_timeout = '5s';
SELECT notes FROM sync.pass();
RESET statement_timeout;
SELECT count(*) AS set_aside FROM sync.set_aside;
SELECT count(*) AS notes_waiting FROM sync.note;

-- And a cancel from another session (pg_cancel_backend, as an operator or a pooler sends it).
SELECT dblink_send_query('canceller',
    format('SELECT pg_sleep(0.3), pg_cancel_backend(%s)', pg_backend_pid())) AS sent;
SELECT notes FROM sync.pass();
SELECT cancelled FROM dblink_get_result('canceller') AS t(slept text, cancelled boolean);
RESET lock_timeout;
SELECT count(*) AS set_aside FROM sync.set_aside;
SELECT count(*) AS notes_waiting FROM sync.note;
SELECT * FROM planned;

-- The holder lets go: the next pass plans the two products, and sets aside the one that cannot
-- be encoded, with its reason.
SELECT dblink_exec('holder', 'ROLLBACK');
SELECT notes, rows_changed, set_aside FROM sync.pass();
SELECT * FROM planned;
SELECT kind, key, reason FROM sync.set_aside;
DELETE FROM sync.set_aside;

-- Filing. A sale refused by its check is kept with the reason; the check is changed, so the retry
-- is due to file it again.
SET client_min_messages = warning;
SELECT sync.receive('00000000-0000-0000-0000-000000000001',
    convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":[{"t":"public.sales","r":{"id":1,"qty":50}}]}', 'UTF8'));
RESET client_min_messages;
SELECT kind, key, reason, tries FROM sync.set_aside;
ALTER TABLE sales DROP CONSTRAINT qty_is_small, ADD CONSTRAINT qty_is_small CHECK (qty < 100);
SELECT dblink_exec('holder', 'BEGIN');
SELECT dblink_exec('holder', 'LOCK TABLE sales IN ACCESS EXCLUSIVE MODE');
-- A lock timeout while filing fails sync.receive whole: nothing filed, nothing kept; the device
-- sends the upload again.
SET lock_timeout = '100ms';
SELECT sync.receive('00000000-0000-0000-0000-000000000001',
    convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000002","rows":[{"t":"public.sales","r":{"id":2,"qty":3}}]}', 'UTF8'));
-- A lock timeout while the retry files a kept row again ends the retry: the row stays kept with
-- its own reason, its tries not counted.
SELECT * FROM sync.retry_set_aside();
RESET lock_timeout;
SELECT kind, key, reason, tries FROM sync.set_aside;
-- The holder lets go: nothing was filed; the upload sent again is filed, and the retry files the
-- kept row.
SELECT dblink_exec('holder', 'ROLLBACK');
SELECT count(*) AS sales FROM sales;
SET client_min_messages = warning;
SELECT sync.receive('00000000-0000-0000-0000-000000000001',
    convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000002","rows":[{"t":"public.sales","r":{"id":2,"qty":3}}]}', 'UTF8'));
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT id, qty FROM sales ORDER BY id;
SELECT count(*) AS set_aside FROM sync.set_aside;

SELECT dblink_disconnect('holder');
SELECT dblink_disconnect('canceller');
\c regression
DROP DATABASE transient_test;
