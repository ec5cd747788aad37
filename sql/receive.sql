-- Filing uploads: sync.receive() files what replicas send up, each row by its table's codec, and
-- leaves the relay what it must send back (docs/DESIGN.md §6), in its own database.
CREATE DATABASE receive_test;
\c receive_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, label text NOT NULL, company int NOT NULL,
                             active boolean NOT NULL DEFAULT true);
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.sales (id uuid PRIMARY KEY, register_id uuid, total numeric(10, 2) NOT NULL
                         CHECK (total >= 0), note text DEFAULT 'none', company int,
                         audited boolean NOT NULL DEFAULT false,
                         total_cents int GENERATED ALWAYS AS ((total * 100)::int) STORED);
CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY, counted numeric(10, 2),
                           closed_at timestamptz, opened_by text NOT NULL DEFAULT 'server');
CREATE TABLE shop.lines (sale_id uuid, n int, qty int NOT NULL, PRIMARY KEY (sale_id, n));
CREATE TABLE shop.ghosts (id int PRIMARY KEY);
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products');
-- audited does not travel, so a replica cannot set it; company is stamped from known().
SELECT sync.record('shop.sales', columns => ARRAY['id', 'register_id', 'total', 'note', 'company',
                                                  'total_cents'],
                   stamp => ARRAY['company']);
SELECT sync.record('shop.lines');
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted', 'closed_at']);

INSERT INTO shop.registers VALUES
    ('00000000-0000-0000-0000-0000000000a1', 'a1', 1, true),
    ('00000000-0000-0000-0000-0000000000a2', 'a2', 2, true),
    ('00000000-0000-0000-0000-0000000000f1', 'f1', 1, false);
INSERT INTO shop.products VALUES (1, 'tea');

-- An upload as a replica encodes it.
CREATE FUNCTION up(id text, rows text, extra text DEFAULT '') RETURNS bytea
LANGUAGE sql AS $$ SELECT convert_to(format('{"v":1,"id":"%s","rows":%s%s}', id, rows, extra), 'UTF8') $$;
-- What receive left for the relay, and what it set aside.
CREATE VIEW answers AS
SELECT coalesce(r.label, a.replica::text) AS replica, a.payload->>'upload' AS upload,
       e->>'t' AS t, e->'k' AS k, e->>'why' AS why
FROM sync.answer a LEFT JOIN shop.registers r ON r.id = a.replica
LEFT JOIN LATERAL jsonb_array_elements(a.payload->'kept') WITH ORDINALITY AS x(e, i) ON true
ORDER BY a.id, x.i;
CREATE VIEW kept AS
SELECT s.kind, coalesce(r.label, s.replica::text) AS replica, c.table_name, s.key,
       CASE WHEN s.body IS NULL THEN NULL
            WHEN octet_length(s.body) > 100 THEN format('(%s bytes)', octet_length(s.body))
            ELSE encode(s.body, 'escape') END AS body,
       s.reason, s.tries
FROM sync.set_aside s LEFT JOIN shop.registers r ON r.id = s.replica
LEFT JOIN sync.codec c ON c.id = s.codec ORDER BY s.id;
CREATE FUNCTION forget() RETURNS void LANGUAGE sql AS $$
    TRUNCATE sync.answer, sync.set_aside, sync.confirmation, sync.holding;
$$;

-- A replica that is not live (or not provisioned yet) is unknown under the default known():
-- its message is dropped with a LOG line, nothing is filed, no ERROR.
SET client_min_messages = log;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1',
                    up('10000000-0000-0000-0000-000000000001', '[{"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000001","n":1,"qty":1}}]'));
RESET client_min_messages;
SELECT count(*) AS lines, (SELECT count(*) FROM sync.upload) AS uploads,
       (SELECT count(*) FROM sync.answer) AS answers FROM shop.lines;

-- The pass provisions the live registers; now they are known.
SELECT provisioned FROM sync.pass();
SELECT r.label, x.next_seq FROM sync.replica x JOIN shop.registers r ON r.id = x.id ORDER BY 1;

-- An upload from a device whose deliveries back off (its line was cut, and answers again) ends the
-- backoff at once: its next message goes at the sender's next look, not at the end of a backoff
-- of up to magic_sync.backoff_max. The failure's figures stay until a delivery is taken.
INSERT INTO sync.delivery (replica, gen, backoff, backoff_until, last_error)
SELECT id, gen, '10 minutes', now() + interval '10 minutes', 'connection refused'
FROM sync.replica WHERE id = '00000000-0000-0000-0000-0000000000a1';
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-0000000000b1', '[]'));
SELECT backoff_until <= now() AS backoff_ended, backoff, last_error FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-0000000000a1';
DELETE FROM sync.delivery;
DELETE FROM sync.upload WHERE id = '10000000-0000-0000-0000-0000000000b1';

-- One upload, every rule of filing: a record is inserted with its travelling columns (audited,
-- which does not travel, and the generated total_cents are ignored; note takes its default) and
-- company is stamped from known() (the default knows nothing: NULL, whatever the replica said);
-- a both row is inserted with its key and replica_columns only; a catalog row and a table that
-- does not sync are refused; rows that fail (a check, a type, a missing key column) are kept
-- with the database's reason, and the rest is filed.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000002', $$[
  {"t":"shop.sales","r":{"id":"5a1e0000-0000-0000-0000-000000000001","register_id":"00000000-0000-0000-0000-0000000000a1","total":5.50,"company":99,"audited":true,"total_cents":1}},
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000001","n":1,"qty":2}},
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000001","n":2,"qty":"two"}},
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000001","n":3,"qty":1}},
  {"t":"shop.sales","r":{"id":"5a1e0000-0000-0000-0000-000000000002","total":-1}},
  {"t":"shop.sales","r":{"total":3}},
  {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":10.00,"opened_by":"replica"}},
  {"t":"shop.products","r":{"id":1,"name":"free tea"}},
  {"t":"shop.ghosts","r":{"id":1}},
  {"t":"no.such_table","r":{"id":1}}]$$));
SELECT id, register_id, total, note, company, audited, total_cents FROM shop.sales;
SELECT * FROM shop.lines ORDER BY n;
SELECT register_id, counted, closed_at, opened_by FROM shop.drawers;
SELECT name FROM shop.products;
SELECT * FROM answers;
SELECT * FROM kept;
SELECT replica, id, jsonb_array_length(kept) AS kept FROM sync.upload;
SELECT forget();

-- Filed rows are changes like any other: captured, and planned by the next pass.
SELECT codec, key FROM sync.noted ORDER BY seq, position;

-- record is insert-if-absent: a second delivery with other content changes nothing. both takes
-- its replica_columns on update (closed_at, absent from the upload, stays as it is) and ignores
-- the rest; a row that is not the replica's (a2's drawer, uploaded by a1) is kept, not inserted:
-- a replica writes only rows it is sent.
UPDATE shop.drawers SET closed_at = '2024-01-01 10:00+00';
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000003', $$[
  {"t":"shop.sales","r":{"id":"5a1e0000-0000-0000-0000-000000000001","total":500}},
  {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":12.50,"opened_by":"replica"}},
  {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a2"}}]$$));
SELECT id, total FROM shop.sales;
SELECT register_id, counted, closed_at AT TIME ZONE 'UTC' AS closed_at, opened_by
FROM shop.drawers ORDER BY register_id;
-- Two rows of one key in one upload are filed in order: the first record stays, the last both
-- update wins.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000004', $$[
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000009","n":1,"qty":7}},
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000009","n":1,"qty":8}},
  {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":1}},
  {"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":2}}]$$));
SELECT qty FROM shop.lines WHERE sale_id = '5a1e0000-0000-0000-0000-000000000009';
SELECT counted FROM shop.drawers WHERE register_id = '00000000-0000-0000-0000-0000000000a1';
SELECT * FROM answers;
SELECT forget();

-- A both row with a NOT NULL column the replica may not write and the server gives no default
-- (register_id): a change of what the replica may write keeps it; a new row without it cannot
-- exist and is kept back with the reason.
CREATE TABLE shop.tabs (id int PRIMARY KEY, register_id uuid NOT NULL, note text);
SELECT sync.both('shop.tabs', "to" => 'register_id', replica_columns => ARRAY['note']);
INSERT INTO shop.tabs VALUES (1, '00000000-0000-0000-0000-0000000000a1', 'open');
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000041', $$[
  {"t":"shop.tabs","r":{"id":1,"note":"paid"}},
  {"t":"shop.tabs","r":{"id":2,"note":"new"}}]$$));
SELECT id, register_id, note FROM shop.tabs ORDER BY id;
SELECT * FROM answers;
SELECT forget();

-- The same upload received three times is filed once and answered three times, the same way.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a2', up('10000000-0000-0000-0000-000000000005', $$[
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000005","n":1,"qty":1}},
  {"t":"shop.products","r":{"id":2,"name":"coffee"}}]$$)) AS status
FROM generate_series(1, 3);
SELECT count(*) AS filed FROM shop.lines WHERE sale_id = '5a1e0000-0000-0000-0000-000000000005';
SELECT * FROM answers;
SELECT count(*) AS set_aside_once FROM sync.set_aside;
-- The id is per replica: another replica's upload with the same id is its own.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000005', '[]'));
SELECT forget();

-- receive runs in the caller's transaction: rolled back, it leaves no row, no answer, no id.
BEGIN;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000006', $$[
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000006","n":1,"qty":1}},
  {"t":"shop.ghosts","r":{"id":1}}]$$));
ROLLBACK;
SELECT (SELECT count(*) FROM shop.lines WHERE sale_id = '5a1e0000-0000-0000-0000-000000000006') AS lines,
       (SELECT count(*) FROM sync.answer) AS answers, (SELECT count(*) FROM sync.set_aside) AS set_aside,
       (SELECT count(*) FROM sync.upload WHERE id = '10000000-0000-0000-0000-000000000006') AS uploads;
-- Sent again, it is filed.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000006', $$[
  {"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000006","n":1,"qty":1}}]$$));
SELECT forget();

-- Bad input of every kind is kept whole, as it came, with the decoder's reason, and answered
-- when the upload id can still be read; never an ERROR.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', convert_to('this is not JSON', 'UTF8')) AS not_json;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', '\xff00fe'::bytea) AS not_utf8;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1',
                    substring(up('10000000-0000-0000-0000-000000000007', '[{"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000007","n":1,"qty":1}}]') FROM 1 FOR 80)) AS truncated;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1',
                    up('10000000-0000-0000-0000-000000000008', '[{"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-000000000008","n":1,"qty":1,"deep":' || repeat('[', 70) || repeat(']', 70) || '}}]')) AS too_deep;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000009', '"many"')) AS rows_not_a_list;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-00000000000a', '[{"t":7,"r":{}}]')) AS table_not_text;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-00000000000b', '[]', ',"applied":-1')) AS applied_negative;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('not-an-upload-id', '[]')) AS id_not_uuid;
SET magic_sync.max_upload_bytes = 1024;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1',
                    up('10000000-0000-0000-0000-00000000000c', '[{"t":"shop.lines","r":{"sale_id":"5a1e0000-0000-0000-0000-00000000000c","n":1,"qty":1,"pad":"' || repeat('x', 1100) || '"}}]')) AS too_big;
RESET magic_sync.max_upload_bytes;
SELECT * FROM kept;
SELECT * FROM answers;
-- Nothing of them was filed; a kept message sent again is answered again, not kept twice.
SELECT count(*) AS lines FROM shop.lines WHERE sale_id IN ('5a1e0000-0000-0000-0000-000000000007',
  '5a1e0000-0000-0000-0000-000000000008', '5a1e0000-0000-0000-0000-00000000000c');
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000009', '"many"')) AS again;
SELECT count(*) AS set_aside FROM sync.set_aside;
SELECT forget();

-- A message of a later protocol version is the one ERROR besides a failing database: SQLSTATE
-- 55000, keep it and send it again after the server is upgraded. Nothing is filed or kept.
DO $$
BEGIN
    PERFORM sync.receive('00000000-0000-0000-0000-0000000000a1',
                         convert_to('{"v":3,"id":"10000000-0000-0000-0000-00000000000d","rows":[]}', 'UTF8'));
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE '% %', SQLSTATE, SQLERRM;
END
$$;
SELECT (SELECT count(*) FROM sync.set_aside) AS set_aside, (SELECT count(*) FROM sync.answer) AS answers;

-- applied: confirmations for the relay to apply; beyond what the replica was ever sent, ignored
-- with a LOG line. untaken: set aside per replica and row, counted when reported again. holds:
-- kept for verification, the latest per scope.
SET client_min_messages = log;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-00000000000e', '[]',
  $$,"applied":1,"untaken":[{"seq":1,"t":"shop.products","k":{"id":1},"why":"no such table here"}],
  "holds":{"all":{"through":3,"fp":"00000000000000000000000000000000000000000000000000000000000000ff","n":1}}$$));
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-00000000000f', '[]',
  $$,"applied":9,"untaken":[{"seq":2,"t":"shop.products","k":{"id":1},"why":"still no such table"},
                            {"seq":1,"t":"shop.products","k":{"id":1},"why":"no such table here"}],
  "holds":{"all":{"through":4,"fp":"00000000000000000000000000000000000000000000000000000000000000fe","n":2,
                  "ranges":[["0000000000000000000000000000000000000000000000000000000000000000","","00000000000000000000000000000000000000000000000000000000000000fe",2]]}}$$));
RESET client_min_messages;
SELECT r.label, c.applied FROM sync.confirmation c JOIN shop.registers r ON r.id = c.replica;
SELECT * FROM kept;
SELECT r.label, h.scope, h.through, encode(h.fp, 'hex') AS fp, h.n, h.ranges
FROM sync.holding h JOIN shop.registers r ON r.id = h.replica;
SELECT forget();

-- A report is settled when it is written at its scope's head with the scope's fingerprint and
-- count, or behind the head (the next report replaces it): the pass looks for a repair to begin
-- only among the reports not settled (sync_internal.repair_targets), not at every replica's.
SELECT s.head, encode(s.fp, 'hex') AS fp, s.n FROM sync.scope s WHERE s.match = '*' \gset
CREATE FUNCTION report(through bigint, fp text, n bigint) RETURNS boolean LANGUAGE sql AS $$
    SELECT sync.receive('00000000-0000-0000-0000-0000000000a1',
                        up(gen_random_uuid()::text, '[]', format(',"holds":{"all":{"through":%s,"fp":"%s","n":%s}}',
                                                      through, fp, n)));
    SELECT h.settled FROM sync.holding h WHERE h.replica = '00000000-0000-0000-0000-0000000000a1';
$$;
SELECT report(:head, :'fp', :n) AS at_head_the_same,
       report(:head, repeat('0', 62) || 'fe', :n) AS at_head_another_fingerprint,
       report(:head, :'fp', :n + 1) AS at_head_another_count,
       report(:head - 1, repeat('0', 62) || 'fe', :n) AS behind_the_head,
       report(:head + 1, :'fp', :n) AS past_the_head;
DROP FUNCTION report;
SELECT forget();

-- An upload sent again as it was stored (an app that keeps what it sends, and sends it again
-- later): answered again, and what it reported, older than what a later upload reported, is not
-- taken. The replica was sent messages 1 and 2 here.
UPDATE sync.replica SET next_seq = 3 WHERE id = '00000000-0000-0000-0000-0000000000a1';
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000020', '[]',
  $$,"applied":1,"untaken":[{"seq":1,"t":"shop.products","k":{"id":1},"why":"as of message 1"}],
  "holds":{"all":{"through":3,"fp":"00000000000000000000000000000000000000000000000000000000000000ff","n":1}}$$));
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000021', '[]',
  $$,"applied":2,"untaken":[{"seq":2,"t":"shop.products","k":{"id":1},"why":"as of message 2"}],
  "holds":{"all":{"through":4,"fp":"00000000000000000000000000000000000000000000000000000000000000fe","n":2}}$$));
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000020', '[]',
  $$,"applied":1,"untaken":[{"seq":1,"t":"shop.products","k":{"id":1},"why":"as of message 1"}],
  "holds":{"all":{"through":3,"fp":"00000000000000000000000000000000000000000000000000000000000000ff","n":1}}$$));
SELECT table_name, key, reason, tries FROM kept;
SELECT r.label, h.scope, h.through, encode(h.fp, 'hex') AS fp, h.n, h.applied
FROM sync.holding h JOIN shop.registers r ON r.id = h.replica;
UPDATE sync.replica SET next_seq = 2 WHERE id = '00000000-0000-0000-0000-0000000000a1';
SELECT forget();

-- What an upload says of the replica counts in the history it was said in: one that names another
-- origin (its device applied messages of a database since restored, or of a primary since failed
-- over) is filed and answered, but its applied, untaken and holds are not taken; said in this
-- history, they are.
UPDATE sync.replica SET next_seq = 3 WHERE id = '00000000-0000-0000-0000-0000000000a1';
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000022', '[]',
  $$,"applied":2,"origin":"1/1/00000000-0000-0000-0000-000000000000",
  "untaken":[{"seq":2,"t":"shop.products","k":{"id":1},"why":"in another history"}],
  "holds":{"all":{"through":4,"fp":"00000000000000000000000000000000000000000000000000000000000000fe","n":2}}$$))
  AS another_history;
SELECT (SELECT count(*) FROM sync.confirmation) AS confirmations, (SELECT count(*) FROM kept) AS kept,
       (SELECT count(*) FROM sync.holding) AS holdings;
SELECT sync_internal.origin() AS origin \gset
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000023', '[]',
  ',"applied":2,"origin":"' || :'origin' || '",
  "holds":{"all":{"through":4,"fp":"00000000000000000000000000000000000000000000000000000000000000fe","n":2}}'))
  AS this_history;
SELECT (SELECT count(*) FROM sync.confirmation) AS confirmations,
       (SELECT count(*) FROM sync.holding) AS holdings;
UPDATE sync.replica SET next_seq = 2 WHERE id = '00000000-0000-0000-0000-0000000000a1';
SELECT forget();

-- The relay moves answers into the outboxes of live replicas as filed messages, numbered after
-- what they were sent; answers of a replica that is no longer live are dropped.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000010', $$[
  {"t":"shop.ghosts","r":{"id":2}}]$$));
-- An upload with no rows (only applied, untaken, holds) is not answered.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000011', '[]'));
SELECT sync.receive('00000000-0000-0000-0000-0000000000a2', up('10000000-0000-0000-0000-000000000012', $$[
  {"t":"shop.ghosts","r":{"id":3}}]$$));
SELECT count(*) AS answers_waiting FROM sync.answer;
UPDATE shop.registers SET active = false WHERE label = 'a2';
SELECT forgotten, messages FROM sync.pass();
SELECT r.label, o.seq, o.gen, o.kind, convert_from(sync.message(o.replica, o.seq), 'UTF8') AS message
FROM sync.outbox o JOIN shop.registers r ON r.id = o.replica WHERE o.kind = 'filed' ORDER BY 1, 2;
SELECT r.label, x.next_seq FROM sync.replica x JOIN shop.registers r ON r.id = x.id WHERE x.live;
SELECT count(*) AS answers_left FROM sync.answer;
UPDATE shop.registers SET active = true WHERE label = 'a2';
SELECT provisioned FROM sync.pass();
-- An upload sent again while its answer waits for the replica (not moved yet, or in the outbox
-- and not confirmed) is answered by that answer, however often it comes: 300 resends of one
-- upload made 300 messages before.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000030', $$[
  {"t":"shop.ghosts","r":{"id":4}}]$$)) AS first;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000030', $$[
  {"t":"shop.ghosts","r":{"id":4}}]$$)) AS again;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000030', $$[
  {"t":"shop.ghosts","r":{"id":4}}]$$)) AS again;
SELECT count(*) AS answers_waiting FROM sync.answer WHERE payload->>'upload' = '10000000-0000-0000-0000-000000000030';
SELECT messages FROM sync.pass();
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000030', $$[
  {"t":"shop.ghosts","r":{"id":4}}]$$)) AS again;
SELECT (SELECT count(*) FROM sync.answer) AS answers_waiting,
       (SELECT count(*) FROM sync.outbox WHERE upload = '10000000-0000-0000-0000-000000000030') AS answers_in_outbox;
-- Confirmed, it is gone: sent again, the upload is answered again.
DELETE FROM sync.outbox WHERE upload = '10000000-0000-0000-0000-000000000030';
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000030', $$[
  {"t":"shop.ghosts","r":{"id":4}}]$$)) AS again;
SELECT count(*) AS answers_waiting FROM sync.answer;
DELETE FROM sync.upload WHERE id = '10000000-0000-0000-0000-000000000030';
-- encode_filed refuses what is not a filed answer.
SELECT sync_internal.encode_filed('00000000-0000-0000-0000-0000000000a1', 1, 1, '{"upload": "x"}');
SELECT forget();

-- An answer too big for one message goes in parts, each within magic_sync.bytes_per_message,
-- numbered one after the other; every part but the last says "more", and a reason too long for
-- a part of its own is cut.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000013',
    (SELECT json_agg(json_build_object('t', 'shop.ghosts', 'r', json_build_object('id', i)))::text
     FROM generate_series(1, 12) i)));
SET magic_sync.bytes_per_message = 680;
SELECT messages FROM sync.pass();
SELECT o.seq - min(o.seq) OVER () AS part, octet_length(sync.message(o.replica, o.seq)) <= 680 - 80 AS within,
       m->>'more' AS more, jsonb_array_length(m->'kept') AS kept,
       sum(jsonb_array_length(m->'kept')) OVER () AS kept_in_all
FROM sync.outbox o
CROSS JOIN LATERAL (SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb AS m) x
WHERE o.kind = 'filed' AND m->>'upload' = '10000000-0000-0000-0000-000000000013' ORDER BY o.seq;
SELECT sync_internal.filed_parts('00000000-0000-0000-0000-0000000000a1',
    jsonb_build_object('upload', '10000000-0000-0000-0000-000000000014',
                       'kept', jsonb_build_array(jsonb_build_object('t', 'shop.ghosts', 'k', '{"id": 1}'::jsonb,
                                                                    'why', repeat('no room ', 100)))),
    480) AS cut;
-- A kept row whose key is too long to name within the limit, even with its reason cut, is named
-- by its hash (protocol version 2): the answer still fits.
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000015',
    json_build_array(json_build_object('t', 'shop.ghosts', 'r', json_build_object('id', repeat('g', 800))))::text));
SELECT messages FROM sync.pass();
SELECT octet_length(sync.message(o.replica, o.seq)) <= 680 - 80 AS within, m->'v' AS v,
       m->'kept'->0->'k' AS k,
       m->'kept'->0->>'kh' = encode(sync_internal.key_hash('shop.ghosts', jsonb_build_object('id', repeat('g', 800))), 'hex')
           AS named_by_its_hash
FROM sync.outbox o
CROSS JOIN LATERAL (SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb AS m) x
WHERE o.kind = 'filed' AND m->>'upload' = '10000000-0000-0000-0000-000000000015' ORDER BY o.seq;
RESET magic_sync.bytes_per_message;
SELECT forget();

-- known() and filing(): known says what the server knows of a replica (NULL: unknown, dropped
-- with a LOG line), stamps come from it, and filing() sets what row policies read. A policy that
-- refuses rows of another company: those rows are kept, the rest filed.
CREATE FUNCTION shop.register_company(register uuid) RETURNS jsonb LANGUAGE sql STABLE
AS $$ SELECT jsonb_build_object('company', r.company) FROM shop.registers r WHERE r.id = register $$;
CREATE FUNCTION shop.as_company(known jsonb) RETURNS void LANGUAGE sql
AS $$ SELECT set_config('app.company', known->>'company', true) $$;
SELECT sync.senders(known => 'shop.register_company(uuid)'::regprocedure,
                    filing => 'shop.as_company(jsonb)'::regprocedure);
CREATE TABLE shop.visits (id int PRIMARY KEY, company int NOT NULL, note text);
SELECT sync.record('shop.visits');
ALTER TABLE shop.visits ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_company ON shop.visits
    USING (company = current_setting('app.company')::int)
    WITH CHECK (company = current_setting('app.company')::int);
CREATE ROLE till;
GRANT sync_receiver TO till;
GRANT USAGE ON SCHEMA shop TO till;
GRANT SELECT ON shop.registers TO till;
GRANT SELECT, INSERT, UPDATE ON shop.visits, shop.sales, shop.lines, shop.drawers TO till;

SET ROLE till;
SET client_min_messages = log;
SELECT sync.receive('00000000-0000-0000-0000-000000000099', up('10000000-0000-0000-0000-000000000013', '[]')) AS stranger;
RESET client_min_messages;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a1', up('10000000-0000-0000-0000-000000000014', $$[
  {"t":"shop.visits","r":{"id":1,"company":1,"note":"own"}},
  {"t":"shop.visits","r":{"id":2,"company":2,"note":"other"}},
  {"t":"shop.visits","r":{"id":3,"company":1,"note":"own too"}},
  {"t":"shop.sales","r":{"id":"5a1e0000-0000-0000-0000-000000000014","total":1,"company":2}}]$$));
-- The filing's settings end with the call: the caller's transaction is as it was.
SELECT current_user, current_setting('app.company', true) AS company;
RESET ROLE;
SELECT id, company, note FROM shop.visits ORDER BY id;
SELECT id, company FROM shop.sales WHERE id = '5a1e0000-0000-0000-0000-000000000014';
SELECT * FROM answers;
SELECT kind, replica, table_name, key, reason FROM kept;
SELECT forget();

-- The receiver reads no sync table (not the outboxes of other replicas) and calls only receive
-- and its helpers.
SET ROLE till;
SELECT count(*) FROM sync.outbox;
SELECT sync_internal.encode_filed('00000000-0000-0000-0000-0000000000a1', 1, 1, '{}');
RESET ROLE;
SELECT p.proname, p.prosecdef AS security_definer,
       has_function_privilege('sync_receiver', p.oid, 'EXECUTE') AS receiver_can,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_can
FROM pg_proc p WHERE p.pronamespace IN ('sync'::regnamespace, 'sync_internal'::regnamespace)
  AND (p.proname IN ('receive', 'encode_filed', 'keep_message', 'keep_upload')
       OR p.proname LIKE 'receive_%'
       OR p.proname LIKE 'upload_%')
ORDER BY p.proname;

-- magic_sync.role (set by a superuser): receive runs as that role, so its policies apply, and
-- only for the call. A login that is not a member of the role cannot file through it.
SET magic_sync.role = 'till';
SELECT sync.receive('00000000-0000-0000-0000-0000000000a2', up('10000000-0000-0000-0000-000000000015', $$[
  {"t":"shop.visits","r":{"id":4,"company":2,"note":"own"}},
  {"t":"shop.visits","r":{"id":5,"company":1,"note":"other"}}]$$));
SELECT current_user;
SELECT id, company, note FROM shop.visits WHERE id > 3 ORDER BY id;
SELECT * FROM answers;
CREATE ROLE clerk IN ROLE sync_receiver;
SET SESSION AUTHORIZATION clerk;
SELECT sync.receive('00000000-0000-0000-0000-0000000000a2', up('10000000-0000-0000-0000-000000000016', '[]'));
RESET SESSION AUTHORIZATION;
RESET magic_sync.role;
SELECT forget();

\c regression
DROP DATABASE receive_test;
DROP ROLE till;
DROP ROLE clerk;
