-- Chunks built ahead: a replica behind by many messages gets, in one pass, the run of chunks the
-- rounds of that pass need, each built from where the one before it ended. What it receives must
-- be what it would receive chunk by chunk: every chunk holds exactly the rows of its range, cut at
-- the row and the byte limit, with a tombstone, a changed row and a row too big for any message
-- among them, while two replicas at two cursors both pass that row in the same round.
CREATE DATABASE ahead_test;
\c ahead_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE TABLE registers (id uuid PRIMARY KEY, label text NOT NULL);
CREATE TABLE items (id int PRIMARY KEY, body text NOT NULL);
SELECT sync.replicas('registers', 'registers');
SELECT sync.catalog('items');
INSERT INTO registers VALUES ('00000000-0000-0000-0000-0000000000a1', 'a1'),
                             ('00000000-0000-0000-0000-0000000000a2', 'a2');

-- Every chunk of every unsent message: who, which message, its range and rows.
CREATE VIEW chunks AS
SELECT g.label AS register, o.seq, (c->>'from')::int AS "from", (c->>'to')::int AS "to",
       (SELECT string_agg((x.e->'k'->>'id') || CASE WHEN x.e->'r' = 'null' THEN ' gone' ELSE '' END,
                          ' ' ORDER BY x.n)
        FROM jsonb_array_elements(c->'rows') WITH ORDINALITY x(e, n)) AS rows,
       (SELECT string_agg(x->'k'->>'id', ' ') FROM jsonb_array_elements(m->'withheld') x) AS withheld,
       octet_length(sync.message(o.replica, o.seq)) AS bytes
FROM sync.outbox o
JOIN registers g ON g.id = o.replica
CROSS JOIN LATERAL (SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb AS m) msg
CROSS JOIN LATERAL jsonb_array_elements(m->'chunks') c
WHERE o.sent_at IS NULL;
CREATE FUNCTION deliver(label text) RETURNS void LANGUAGE sql AS $$
    UPDATE sync.outbox SET sent_at = now() WHERE sent_at IS NULL
        AND replica = (SELECT id FROM registers WHERE registers.label = deliver.label);
    INSERT INTO sync.confirmation (replica, applied) SELECT replica, max(seq) FROM sync.outbox
        WHERE replica = (SELECT id FROM registers WHERE registers.label = deliver.label)
        GROUP BY replica;
$$;

SET magic_sync.rows_per_message = 3;
SET magic_sync.bytes_per_message = 980;
SET magic_sync."window" = 1;
INSERT INTO items SELECT i, 'row ' || i FROM generate_series(1, 4) i;
SELECT messages FROM sync.pass();
-- a1 takes both of its messages; a2 keeps its first unsent, so its cursor stays behind.
SELECT deliver('a1');
SELECT messages FROM sync.pass();
SELECT deliver('a1');
SELECT register, "from", "to", rows FROM chunks ORDER BY register, seq;

-- Then 26 more rows: one too big for any message (12), three that fill more than a message's
-- bytes together (20, 21, 22), a row deleted (2) and one changed (3).
INSERT INTO items SELECT i, 'row ' || i FROM generate_series(5, 30) i;
UPDATE items SET body = repeat('b', 1200) WHERE id = 12;
UPDATE items SET body = repeat('m', 280) WHERE id IN (20, 21, 22);
DELETE FROM items WHERE id = 2;
UPDATE items SET body = 'changed' WHERE id = 3;
SELECT deliver('a2');
RESET magic_sync."window";

-- Passes until nothing is left to send: what the watched replicas were sent, recorded as it was
-- written, and every message of the delivered ones taken after each pass.
CREATE TABLE received AS SELECT 0 AS pass, * FROM chunks WHERE false;
CREATE FUNCTION drain(watched text[], delivered text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    pass int := 0;
    written bigint;
BEGIN
    TRUNCATE received;
    LOOP
        pass := pass + 1;
        SELECT messages INTO written FROM sync.pass();
        EXIT WHEN written = 0;
        INSERT INTO received SELECT pass, * FROM chunks WHERE register = ANY (watched);
        PERFORM deliver(label) FROM unnest(delivered) label;
    END LOOP;
END
$$;
SELECT drain('{a1,a2}', '{a1,a2}');
SELECT pass, register, seq, "from", "to", rows, withheld FROM received ORDER BY register, seq;
SELECT max(bytes) <= 900 AS every_message_within_the_limit FROM received;

-- Each chunk holds exactly the rows of its range, in seq order: every row whose latest version
-- has a seq in (from, to], the too-big row withheld instead.
SELECT count(*) AS chunks,
       count(*) FILTER (WHERE coalesce(rows, '') || coalesce(' ' || withheld, '') = coalesce((
           SELECT string_agg((r.key->>'id') || CASE WHEN r.gone THEN ' gone' ELSE '' END, ' '
                             ORDER BY r.seq)
           FROM sync.row r WHERE r.seq > c."from" AND r.seq <= c."to" AND r.key->>'id' <> '12'),
           '') || CASE WHEN c.withheld IS NOT NULL THEN ' 12' ELSE '' END) AS exact
FROM received c;
-- Each replica's chunks follow each other, from its cursor to the head, with no gap.
SELECT register, bool_and("from" = prev_to) AS contiguous, max("to") = (SELECT head FROM sync.scope WHERE match = '*') AS at_head
FROM (SELECT register, "from", "to", lag("to") OVER (PARTITION BY register ORDER BY seq) AS prev_to
      FROM received) c WHERE prev_to IS NOT NULL GROUP BY register ORDER BY register;
SELECT kind, key, tries FROM sync.set_aside;

-- A replica that joins now starts from 0: its first chunk (at 2 rows a message) leaves tombstones
-- out, the chunks after it carry them (row 2's, and row 25's, deleted now), so the first is built
-- alone and the rest from its end.
SET magic_sync.rows_per_message = 2;
DELETE FROM items WHERE id = 25;
INSERT INTO registers VALUES ('00000000-0000-0000-0000-0000000000a3', 'a3');
SELECT drain('{a3}', '{a1,a2,a3}');
SELECT pass, register, seq, "from", "to", rows, withheld FROM received ORDER BY register, seq;

-- A replica's own upload in its run (an echo): whether it goes back depends on the cursor the
-- chunk starts from, so the run stops before it and the rest is built from its own cursor. a1 is
-- the only member of its sales' scope; it is sent sale 1 to 4, then uploads sale 10, which it
-- was not sent.
CREATE TABLE sales (id int PRIMARY KEY, register_id uuid NOT NULL, note text);
SELECT sync.both('sales', "to" => 'register_id', replica_columns => ARRAY['register_id', 'note']);
SET magic_sync."window" = 1;
INSERT INTO sales SELECT i, '00000000-0000-0000-0000-0000000000a1', 'server'
FROM generate_series(1, 12) i;
SELECT messages FROM sync.pass();
SELECT deliver('a1');
SELECT deliver('a2');
SELECT messages FROM sync.pass();
SELECT register, "from", "to", rows FROM chunks ORDER BY register, seq;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to(format(
    '{"v":1,"id":"10000000-0000-0000-0000-000000000001","rows":[{"t":%s,"r":{"id":10,"register_id":"00000000-0000-0000-0000-0000000000a1","note":"mine"}}]}',
    to_json((SELECT table_name FROM sync.codec WHERE relation = 'sales'::regclass))), 'UTF8'));
SELECT deliver('a1');
RESET magic_sync."window";
SELECT drain('{a1,a2,a3}', '{a1}');
SELECT pass, register, seq, "from", "to", rows FROM received ORDER BY register, seq;

\c regression
DROP DATABASE ahead_test;
