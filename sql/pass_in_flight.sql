-- A message in flight: while a sender delivers a replica's message (its lease holds), the passes
-- write that replica nothing small behind it. What changes meanwhile waits, and goes in one message
-- once the delivery ends; a full message (cut at a limit, more rows after it) is not held back, and
-- neither is anything for a replica nobody is delivering to, nor behind a lease that ran out.
CREATE DATABASE in_flight_test;
\c in_flight_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE TABLE registers (id uuid PRIMARY KEY, label text NOT NULL);
CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);
SELECT sync.replicas('registers', 'registers');
SELECT sync.catalog('items');
INSERT INTO registers VALUES ('00000000-0000-0000-0000-0000000000a1', 'a1'),
                             ('00000000-0000-0000-0000-0000000000a2', 'a2');
INSERT INTO items VALUES (1, 'tea');
SET magic_sync.rows_per_message = 3;

-- Every message in the outbox, sent or not, with the items it carries in order.
CREATE VIEW messages AS
SELECT g.label AS register, o.seq, o.sent_at IS NOT NULL AS sent,
       (SELECT string_agg(x->'r'->>'name', ' ' ORDER BY n)
        FROM jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c,
             jsonb_array_elements(c->'rows') WITH ORDINALITY r(x, n)) AS items
FROM sync.outbox o JOIN registers g ON g.id = o.replica
ORDER BY g.label, o.seq;

SELECT messages FROM sync.pass();
-- A sender takes a1's first message, as magic-sync-sender does, and is delivering it.
SELECT g.label, n.seq FROM sync.next(1, '1 hour', ARRAY['00000000-0000-0000-0000-0000000000a1'::uuid], 1) n
JOIN registers g ON g.id = n.replica;

-- Two changes while it is in flight: a2 gets each as it comes; a1 nothing yet.
UPDATE items SET name = 'green tea' WHERE id = 1;
SELECT messages FROM sync.pass();
INSERT INTO items VALUES (2, 'coffee');
SELECT messages FROM sync.pass();
SELECT * FROM messages;

-- Five more: the full messages go behind the one in flight, the rest waits.
INSERT INTO items SELECT i, 'item ' || i FROM generate_series(3, 7) i;
SELECT messages FROM sync.pass();
SELECT * FROM messages WHERE register = 'a1';

-- The delivery ends: the relay is woken, and what waited goes in one message.
SELECT sync.sent('00000000-0000-0000-0000-0000000000a1', 1);
SELECT messages FROM sync.pass();
SELECT * FROM messages WHERE register = 'a1';

-- A lease that ran out holds nothing back: its sender hung, the next one will take the message.
SELECT g.label, n.seq FROM sync.next(1, '1 hour', ARRAY['00000000-0000-0000-0000-0000000000a1'::uuid], 1) n
JOIN registers g ON g.id = n.replica;
UPDATE items SET name = 'black tea' WHERE id = 1;
SELECT messages FROM sync.pass();
UPDATE sync.outbox SET lease_until = now() - interval '1 second'
WHERE replica = '00000000-0000-0000-0000-0000000000a1' AND lease_until IS NOT NULL;
SELECT messages FROM sync.pass();
SELECT * FROM messages WHERE register = 'a1' AND NOT sent;

\c postgres
DROP DATABASE in_flight_test;
