-- Capture: every transaction that changes rows of a synced table writes ONE note for that table
-- when it commits, holding the keys of the rows it changed, written by the C++ trigger
-- (declarations from the `declare` test). :notes shows the
-- notes written since the last look, one line per key: `note` numbers the notes, `keys` is how
-- many keys the note says it holds.
\set notes 'SELECT dense_rank() OVER (ORDER BY n.seq) AS note, coalesce(c.table_name, ''(replicas)'') AS "table", n.key, n.key_count AS keys FROM sync.noted n LEFT JOIN sync.codec c ON c.id = n.codec ORDER BY n.seq, n.position; TRUNCATE sync.note;'
\set SHOW_CONTEXT never
TRUNCATE sync.note;

-- A declaration notes its whole table (key NULL) so the next pass looks at every row.
SELECT sync.catalog('shop.products');
:notes

-- A multi-row INSERT: one note, a key per row. A pass that takes part of a note leaves the rest
-- of its keys (sync_internal.note_keys_from).
INSERT INTO shop.products VALUES (1, 'tea', 2.50), (2, 'coffee', 3.00), (3, 'cake', 4.25);
SELECT k.key AS left_from_the_second FROM sync.note n, sync.note_keys(sync_internal.note_keys_from(n.keys, 2)) AS k(key);
SELECT count(*) AS left_from_the_fourth FROM sync.note n, sync.note_keys(sync_internal.note_keys_from(n.keys, 4));
-- ...and reads the part it takes only: the first two keys.
SELECT k.key AS first_two FROM sync.note n, sync.note_keys(n.keys, 2) AS k(key);
:notes

-- An UPDATE of other columns: a key per row changed.
UPDATE shop.products SET price = price + 1 WHERE id <= 2;
:notes

-- An UPDATE that changes the key notes the new key and the old one.
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

-- A statement's keys are built as jsonb_build_object builds them, whatever the writer's
-- settings: a date key is ISO under any DateStyle.
SET DateStyle = 'SQL, DMY';
INSERT INTO shop.events VALUES (7, '2026-03-04', 'stocktake');
RESET DateStyle;
:notes
DELETE FROM shop.events WHERE id = 7;
TRUNCATE sync.note;

-- A big statement writes one note all the same.
INSERT INTO shop.products SELECT i, 'item ' || i, 1 FROM generate_series(1000, 10999) i;
SELECT count(*) AS notes, sum(key_count) AS keys,
       (SELECT count(key) FROM sync.noted) AS keys_held,
       (SELECT count(DISTINCT key) FROM sync.noted) AS distinct_keys
FROM sync.note;
DELETE FROM shop.products WHERE id >= 1000;
SELECT count(*) AS notes, sum(key_count) AS keys FROM sync.note;
TRUNCATE sync.note;

-- A column dropped before the key, and one added after, change nothing.
ALTER TABLE shop.products ADD COLUMN note text;
INSERT INTO shop.products VALUES (50, 'salt', 0.50, 'fine');
UPDATE shop.products SET note = 'coarse' WHERE id = 50;
ALTER TABLE shop.products DROP COLUMN note;
UPDATE shop.products SET price = 0.60 WHERE id = 50;
:notes

-- A note's keys are read with the types they were noted with: a key column whose type no longer
-- exists reads as one NULL (every row of the codec is looked at again), and bytes that are not a
-- note's keys are refused.
SELECT key FROM sync.note_keys('\x0100000000000000696400'::bytea) AS key;
SELECT key FROM sync.note_keys('\x01000000'::bytea) AS key;
SELECT key FROM sync.note_keys('\x0100000014000000696400ffff'::bytea) AS key;

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

-- A transaction's statements write one note per table, when it commits (none is there before):
-- the keys of a released savepoint stay, those of one rolled back go, with those of the
-- savepoints inside it; a statement that failed in a PL/pgSQL block takes its keys with it.
BEGIN;
INSERT INTO shop.products VALUES (33, 'rice', 1.50);
INSERT INTO shop.prices VALUES (7, 20, 0.99);
SAVEPOINT kept;
UPDATE shop.products SET price = 1.60 WHERE id = 33;
INSERT INTO shop.products VALUES (34, 'flour', 1.10);
RELEASE SAVEPOINT kept;
SAVEPOINT dropped;
INSERT INTO shop.products VALUES (35, 'sugar', 0.90);
SAVEPOINT inner_kept;
INSERT INTO shop.products VALUES (36, 'salt', 0.40);
RELEASE SAVEPOINT inner_kept;
ROLLBACK TO SAVEPOINT dropped;
DO $$
BEGIN
    INSERT INTO shop.products VALUES (37, 'yeast', 0.70);
    BEGIN
        INSERT INTO shop.products VALUES (38, 'soda', 0.60);
        INSERT INTO shop.products VALUES (37, 'yeast again', 0.70);
    EXCEPTION WHEN unique_violation THEN
        NULL;
    END;
END
$$;
DELETE FROM shop.products WHERE id = 34;
SELECT count(*) AS notes_before_commit FROM sync.note;
COMMIT;
:notes

-- A key column that changes type within a transaction: the keys noted before and after are
-- each read with their own type (two notes). The ALTER ends the table's codec (the key's type
-- changed): the table is declared again and noted whole, and the note of the old codec is
-- left for the pass to drop.
BEGIN;
INSERT INTO shop.events VALUES (8, '2026-06-01', 'delivery');
ALTER TABLE shop.events ALTER COLUMN id TYPE bigint;
INSERT INTO shop.events VALUES (9, '2026-06-02', 'delivery');
COMMIT;
SELECT n.key_count, (get_byte(n.keys, 4) + 256 * get_byte(n.keys, 5))::oid::regtype AS first_key_type,
       c.id IS NULL AS codec_ended, k.key
FROM sync.note n LEFT JOIN sync.codec c ON c.id = n.codec, sync.note_keys(n.keys) k(key)
ORDER BY n.seq;
DELETE FROM shop.events WHERE id IN (8, 9);
ALTER TABLE shop.events ALTER COLUMN id TYPE int;
TRUNCATE sync.note;

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
CREATE TRIGGER misuse BEFORE INSERT ON shop.misuse FOR EACH ROW EXECUTE FUNCTION sync.capture('1', 'id');
INSERT INTO shop.misuse VALUES (1);
DROP TABLE shop.misuse;

-- The capture writes sync.note's heap directly: an index added to it would not be maintained, so
-- a capture refuses to write past one.
CREATE INDEX note_by_codec ON sync.note (codec);
INSERT INTO shop.products VALUES (60, 'pepper', 1.00);
DROP INDEX sync.note_by_codec;

-- After sync.drop() the table's changes are no longer noted.
SELECT sync.drop('shop.prices');
TRUNCATE sync.note;
INSERT INTO shop.prices VALUES (5, 20, 9.99);
:notes
