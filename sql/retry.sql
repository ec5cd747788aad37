-- On its retry timer the relay tries again what was set aside; a deploy that fixed the cause
-- lets it through. Here: an uploaded sale refused by a constraint is kept, the constraint is
-- fixed, and the retry files it.
CREATE DATABASE retry_test;
\c retry_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE TABLE registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE sales (id int PRIMARY KEY, qty int NOT NULL CONSTRAINT qty_is_small CHECK (qty < 10));
SELECT sync.replicas('registers', 'registers', live => 'active');
SELECT sync.record('sales');
INSERT INTO registers VALUES ('00000000-0000-0000-0000-000000000001');
SELECT provisioned FROM sync.pass();

SET client_min_messages = warning;
SELECT sync.receive('00000000-0000-0000-0000-000000000001',
    convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":[{"t":"public.sales","r":{"id":1,"qty":2}},{"t":"public.sales","r":{"id":2,"qty":50}}]}', 'UTF8'));
-- A message that could not be read at all is kept as it came.
SELECT sync.receive('00000000-0000-0000-0000-000000000001', convert_to('{"v":1,"id":', 'UTF8'));
RESET client_min_messages;
SELECT id, qty FROM sales ORDER BY id;
SELECT kind, codec IS NOT NULL AS one_row, key, reason, tries FROM sync.set_aside ORDER BY id;

-- The fix is deployed: the limit is raised. The retry files the kept row; the unreadable
-- message stays kept, its tries counted.
ALTER TABLE sales DROP CONSTRAINT qty_is_small, ADD CONSTRAINT qty_is_small CHECK (qty < 100);
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT id, qty FROM sales ORDER BY id;
SELECT kind, codec IS NOT NULL AS one_row, key, reason, tries FROM sync.set_aside ORDER BY id;

-- A row refused by a check waits for a change: the retry leaves it until one comes (here, the
-- constraint made again), then tries it: still refused, it is kept again and counted.
ALTER TABLE sales DROP CONSTRAINT qty_is_small, ADD CONSTRAINT qty_is_small CHECK (qty < 3) NOT VALID;
SET client_min_messages = warning;
SELECT sync.receive('00000000-0000-0000-0000-000000000001',
    convert_to('{"v":1,"id":"10000000-0000-0000-0000-000000000002","rows":[{"t":"public.sales","r":{"id":3,"qty":7}}]}', 'UTF8'));
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT kind, key, reason, tries FROM sync.set_aside WHERE codec IS NOT NULL;
ALTER TABLE sales DROP CONSTRAINT qty_is_small, ADD CONSTRAINT qty_is_small CHECK (qty < 5) NOT VALID;
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT kind, key, reason, tries FROM sync.set_aside WHERE codec IS NOT NULL;

\c regression
DROP DATABASE retry_test;
