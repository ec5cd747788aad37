-- Capture: every kind of change writes one note per changed key, written by the C++ trigger
-- (declarations from the `declare` test). :notes shows the notes taken since the last look.
\set notes 'SELECT coalesce(c.table_name, ''(replicas)'') AS "table", n.key FROM sync.note n LEFT JOIN sync.codec c ON c.id = n.codec ORDER BY n.seq; TRUNCATE sync.note;'
\set SHOW_CONTEXT never
TRUNCATE sync.note;

-- A declaration notes its whole table (key NULL) so the next pass looks at every row.
SELECT sync.catalog('shop.products');
:notes

-- A multi-row INSERT: one note per row.
INSERT INTO shop.products VALUES (1, 'tea', 2.50), (2, 'coffee', 3.00), (3, 'cake', 4.25);
:notes

-- An UPDATE of other columns: one note per row changed.
UPDATE shop.products SET price = price + 1 WHERE id <= 2;
:notes

-- An UPDATE that changes the key notes the old key and the new one.
UPDATE shop.products SET id = 10 WHERE id = 3;
:notes

-- A statement that changes nothing notes nothing: no row matched, or rows left as they were.
UPDATE shop.products SET price = 0 WHERE false;
UPDATE shop.products SET name = name;
DELETE FROM shop.products WHERE id < 0;
:notes

-- A multi-row DELETE.
DELETE FROM shop.products WHERE id IN (1, 2);
:notes

-- TRUNCATE notes the whole table.
TRUNCATE shop.products;
:notes

-- COPY is captured like INSERT.
COPY shop.products FROM stdin;
20	bread	1.20
21	butter	2.10
\.
:notes

-- A composite key travels with all its columns.
INSERT INTO shop.prices VALUES (1, 20, 1.10), (2, 20, 1.30);
:notes
UPDATE shop.prices SET store_id = 3 WHERE store_id = 2;
:notes

-- A rolled-back statement leaves no note, nor does a rolled-back savepoint.
BEGIN;
INSERT INTO shop.products VALUES (30, 'jam', 3.50);
ROLLBACK;
BEGIN;
INSERT INTO shop.products VALUES (31, 'honey', 5.00);
SAVEPOINT s;
INSERT INTO shop.products VALUES (32, 'oats', 2.00);
ROLLBACK TO SAVEPOINT s;
COMMIT;
:notes

-- The replicas table is captured too (codec 0, keyed by id).
INSERT INTO shop.registers (id, store_id, label) VALUES ('00000000-0000-0000-0000-00000000000a', 1, 'front');
UPDATE shop.registers SET active = false WHERE id = '00000000-0000-0000-0000-00000000000a';
:notes

-- A partitioned table: rows inserted through the parent or moved between partitions.
INSERT INTO shop.events VALUES (1, '2026-05-01', 'opened'), (2, '2027-02-01', 'closed');
UPDATE shop.events SET at = '2027-05-01' WHERE id = 1;
:notes

-- A role with no privilege on sync writes a synced table; its changes are noted all the same,
-- and it cannot read or write the notes itself.
CREATE ROLE clerk;
GRANT USAGE ON SCHEMA shop TO clerk;
GRANT INSERT, UPDATE ON shop.products TO clerk;
SET ROLE clerk;
INSERT INTO shop.products VALUES (40, 'milk', 1.00);
SELECT count(*) FROM sync.note;
INSERT INTO sync.note (codec, key) VALUES (1, '{"id": 1}');
RESET ROLE;
:notes
DROP OWNED BY clerk;
DROP ROLE clerk;

-- The trigger function refuses to be used any other way.
SELECT sync.capture();
CREATE TABLE shop.misuse (id int PRIMARY KEY);
CREATE TRIGGER misuse AFTER INSERT ON shop.misuse FOR EACH ROW EXECUTE FUNCTION sync.capture('1', 'id');
INSERT INTO shop.misuse VALUES (1);
DROP TABLE shop.misuse;

-- After sync.drop() the table's changes are no longer noted.
SELECT sync.drop('shop.prices');
TRUNCATE sync.note;
INSERT INTO shop.prices VALUES (5, 20, 9.99);
:notes
