-- Echoes: a `both` row filed from a replica's upload is a change like any other, but it is not
-- sent back to that replica when the replica is the only member of the row's scope and holds the
-- row exactly as it was filed (the row it had, with its upload over it): its message for that
-- scope moves its cursor past the row without the row. In a shared scope, or when the filed row
-- is not what the replica holds, the row goes back (and applies as a no-op when it is the same).
CREATE DATABASE echo_test;
\c echo_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, label text NOT NULL, store int NOT NULL);
CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY,
                           counted numeric(10, 2) CONSTRAINT counted_is_small CHECK (counted < 1000),
                           opened_by text NOT NULL DEFAULT 'server');
CREATE TABLE shop.shelves (store int, n int, label text, PRIMARY KEY (store, n));
SELECT sync.replicas('shop.registers', 'registers');
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted']);
SELECT sync.both('shop.shelves', "to" => 'store = store', replica_columns => ARRAY['label']);
INSERT INTO shop.registers VALUES
    ('00000000-0000-0000-0000-0000000000a1', 'a1', 1),
    ('00000000-0000-0000-0000-0000000000a2', 'a2', 1),
    ('00000000-0000-0000-0000-0000000000b1', 'b1', 2);
INSERT INTO shop.drawers VALUES
    ('00000000-0000-0000-0000-0000000000a1', 10.00, 'alice'),
    ('00000000-0000-0000-0000-0000000000b1', 5.00, 'bob');
INSERT INTO shop.shelves VALUES (1, 1, 'tea'), (2, 1, 'coffee');

CREATE FUNCTION up(id text, rows text) RETURNS bytea
LANGUAGE sql AS $$ SELECT convert_to(format('{"v":1,"id":"%s","rows":%s}', id, rows), 'UTF8') $$;
-- Every replica took and applied everything it was sent.
CREATE FUNCTION deliver_all() RETURNS void LANGUAGE sql AS $$
    UPDATE sync.outbox SET sent_at = now() WHERE sent_at IS NULL;
    INSERT INTO sync.confirmation (replica, applied) SELECT replica, max(seq) FROM sync.outbox GROUP BY replica;
$$;
-- The unsent messages, one line per chunk: the scope, the cursor it moves, the rows it carries.
CREATE VIEW messages AS
SELECT g.label AS register, o.kind, c->>'scope' AS scope,
       (c->>'to')::bigint > (c->>'from')::bigint AS advances,
       (SELECT string_agg(format('%s %s', x->>'t', x->'r'), '; ')
        FROM jsonb_array_elements(c->'rows') x) AS rows
FROM sync.outbox o
JOIN shop.registers g ON g.id = o.replica
CROSS JOIN LATERAL (SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb AS m) msg
LEFT JOIN LATERAL jsonb_array_elements(m->'chunks') c ON true
WHERE o.sent_at IS NULL
ORDER BY g.label, o.seq, c->>'scope';

SELECT messages FROM sync.pass();
SELECT deliver_all();
SELECT messages FROM sync.pass();

-- a1 counts its drawer: the upload, over the row a1 holds, is the row as filed. a1 is the only
-- member of its drawer's scope: it gets the answer, and a message that moves its cursor in that
-- scope past the row, without the row.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000001',
    '[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":12.50}}]'));
SELECT counted, opened_by FROM shop.drawers WHERE register_id = '00000000-0000-0000-0000-0000000000a1';
SELECT messages FROM sync.pass();
SELECT * FROM messages;
SELECT count(*) AS echoes_left FROM sync.echo;
SELECT deliver_all();
SELECT messages FROM sync.pass();

-- A shelf is in a scope shared by a1 and a2: a1's label reaches a2, and a1 too.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000002',
    '[{"t":"shop.shelves","r":{"store":1,"n":1,"label":"green tea"}}]'));
SELECT messages FROM sync.pass();
SELECT * FROM messages;
SELECT deliver_all();
SELECT messages FROM sync.pass();

-- b1 writes its count as 7, which the server files as 7.00: the row as filed is not the one b1
-- holds, so it goes back.
SELECT sync.receive('00000000-0000-0000-0000-0000000000b1', up('10000000-0000-0000-0000-000000000003',
    '[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000b1","counted":7}}]'));
SELECT messages FROM sync.pass();
SELECT * FROM messages;
SELECT deliver_all();
SELECT messages FROM sync.pass();

-- The server changes the row after the upload and before the pass: the version planned is not
-- the upload's, so it goes back. Likewise a column the replica may not write (opened_by), which
-- filing ignores.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000004',
    '[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":13.00}}]'));
UPDATE shop.drawers SET opened_by = 'carol' WHERE register_id = '00000000-0000-0000-0000-0000000000a1';
SELECT sync.receive('00000000-0000-0000-0000-0000000000b1', up('10000000-0000-0000-0000-000000000005',
    '[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000b1","counted":8.00,"opened_by":"mallory"}}]'));
SELECT messages FROM sync.pass();
SELECT * FROM messages;
SELECT deliver_all();
SELECT messages FROM sync.pass();

-- b1 is the only register of store 2: its shelf label is not sent back. A register that joins
-- store 2 later gets the shelf as filed, and so does b1 once the scope is shared.
SELECT sync.receive('00000000-0000-0000-0000-0000000000b1', up('10000000-0000-0000-0000-000000000006',
    '[{"t":"shop.shelves","r":{"store":2,"n":1,"label":"dark coffee"}}]'));
SELECT messages FROM sync.pass();
SELECT * FROM messages;
INSERT INTO shop.registers VALUES ('00000000-0000-0000-0000-0000000000b2', 'b2', 2);
SELECT messages FROM sync.pass();
SELECT * FROM messages WHERE scope LIKE 'store%';
SELECT deliver_all();
SELECT messages FROM sync.pass();
SELECT sync.receive('00000000-0000-0000-0000-0000000000b1', up('10000000-0000-0000-0000-000000000007',
    '[{"t":"shop.shelves","r":{"store":2,"n":1,"label":"decaf"}}]'));
SELECT messages FROM sync.pass();
SELECT * FROM messages;

SELECT deliver_all();
SELECT messages FROM sync.pass();

-- A row kept and filed later by the relay's retry: the replica took the answer to its own upload
-- (the row was kept) and does not know the retry's, so the row goes back to it.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000008',
    '[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":2000.00}}]'));
SELECT messages FROM sync.pass();
SELECT deliver_all();
SELECT messages FROM sync.pass();
ALTER TABLE shop.drawers DROP CONSTRAINT counted_is_small,
    ADD CONSTRAINT counted_is_small CHECK (counted < 10000);
SET client_min_messages = warning;
SELECT * FROM sync.retry_set_aside();
RESET client_min_messages;
SELECT counted FROM shop.drawers WHERE register_id = '00000000-0000-0000-0000-0000000000a1';
SELECT messages FROM sync.pass();
SELECT * FROM messages WHERE kind = 'rows';

\c regression
DROP DATABASE echo_test;
