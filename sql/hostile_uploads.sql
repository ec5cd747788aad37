-- Hostile uploads (docs/DESIGN.md §6, §10): whatever bytes a replica sends up, sync.receive keeps them
-- (whole, or row by row with the database's reason) and answers them when the upload id can be
-- read; nothing else changes, no ERROR (but for a later protocol version), and the backend stays
-- up. One table of cases, one query that runs them all, in its own database.
CREATE DATABASE hostile_test;
\c hostile_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE SCHEMA shop;
CREATE TABLE shop.registers (id uuid PRIMARY KEY, label text NOT NULL, active boolean NOT NULL DEFAULT true);
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.sales (id int PRIMARY KEY, total numeric(10, 2) NOT NULL CHECK (total >= 0), note text);
CREATE TABLE shop.notes (id text PRIMARY KEY, body text);
CREATE TABLE shop.readings (id int PRIMARY KEY, value numeric);
-- Records that go back down to their register.
CREATE TABLE shop.scores (id int PRIMARY KEY, register_id uuid, score numeric);
-- Without a row policy: the engine alone keeps each register to its own assignments.
CREATE TABLE shop.assignments (id int PRIMARY KEY, register_id uuid, status text);
CREATE TABLE shop.drawers (register_id uuid PRIMARY KEY, counted numeric(10, 2),
                           opened_by text NOT NULL DEFAULT 'server');
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT sync.catalog('shop.products');
SELECT sync.record('shop.sales');
SELECT sync.record('shop.notes');
SELECT sync.record('shop.readings');
SELECT sync.record('shop.scores', "to" => 'register_id');
SELECT sync.both('shop.assignments', "to" => 'register_id', replica_columns => ARRAY['status']);
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted']);

-- The app's up route files as its own role, under a policy that lets a register write only its
-- own drawer (filing() says which register is filing).
CREATE FUNCTION shop.known(register uuid) RETURNS jsonb LANGUAGE sql STABLE
AS $$ SELECT jsonb_build_object('register', r.id) FROM shop.registers r WHERE r.id = register AND r.active $$;
CREATE FUNCTION shop.as_register(known jsonb) RETURNS void LANGUAGE sql
AS $$ SELECT set_config('shop.register', known->>'register', true) $$;
SELECT sync.senders(known => 'shop.known(uuid)'::regprocedure,
                    filing => 'shop.as_register(jsonb)'::regprocedure);
ALTER TABLE shop.drawers ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_drawer ON shop.drawers
    USING (register_id = current_setting('shop.register')::uuid)
    WITH CHECK (register_id = current_setting('shop.register')::uuid);
CREATE ROLE hostile_route IN ROLE sync_receiver;
GRANT USAGE ON SCHEMA shop TO hostile_route;
GRANT SELECT ON shop.registers TO hostile_route;
GRANT SELECT, INSERT, UPDATE ON shop.sales, shop.notes, shop.readings, shop.drawers, shop.assignments,
    shop.scores TO hostile_route;

-- The hostile register, and a bystander that must not notice anything.
INSERT INTO shop.registers VALUES ('00000000-0000-0000-0000-0000000000a1', 'hostile'),
                                  ('00000000-0000-0000-0000-0000000000b1', 'bystander');
INSERT INTO shop.products VALUES (1, 'tea');
INSERT INTO shop.sales VALUES (100, 1.00, 'from the server');
INSERT INTO shop.assignments VALUES (30, '00000000-0000-0000-0000-0000000000b1', 'open'),
                                    (31, '00000000-0000-0000-0000-0000000000a1', 'open');
INSERT INTO shop.drawers (register_id, counted) VALUES ('00000000-0000-0000-0000-0000000000a1', 5),
                                                       ('00000000-0000-0000-0000-0000000000b1', 7);
SELECT provisioned, messages FROM sync.pass();

-- The id of case n, and an upload as a replica encodes it.
CREATE FUNCTION id(n int) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT format('7e570000-0000-0000-0000-%s', lpad(n::text, 12, '0')) $$;
CREATE FUNCTION up(n int, rows text, extra text DEFAULT '') RETURNS bytea LANGUAGE sql IMMUTABLE
AS $$ SELECT convert_to(format('{"v":1,"id":"%s","rows":%s%s}', id(n), rows, extra), 'UTF8') $$;
-- Bytes spliced into an upload (what convert_to cannot make: invalid UTF-8, NUL).
CREATE FUNCTION up_with(n int, before text, bytes bytea, after text) RETURNS bytea LANGUAGE sql IMMUTABLE
AS $$ SELECT convert_to(format('{"v":1,"id":"%s","rows":%s', id(n), before), 'UTF8') || bytes || convert_to(after, 'UTF8') $$;

-- upload: the id the case carries (NULL when it cannot be read, so it cannot be answered).
CREATE TABLE cases (n int PRIMARY KEY, name text NOT NULL, upload uuid, message bytea NOT NULL);
INSERT INTO cases VALUES
-- Cut short, or not JSON at all.
(1, 'empty', NULL, ''),
(2, 'not JSON', NULL, convert_to('DROP TABLE shop.sales', 'UTF8')),
(3, 'cut short inside the id', NULL, substring(up(3, '[]') FROM 1 FOR 30)),
(4, 'cut short after the id', id(4)::uuid,
    substring(up(4, '[{"t":"shop.sales","r":{"id":4,"total":4}}]') FROM 1 FOR 70)),
(5, 'cut short inside a character', id(5)::uuid, up_with(5, '[{"t":"shop.notes","r":{"id":"', '\xc3', '')),
(6, 'two messages in one', id(6)::uuid, up(6, '[]') || up(6, '[]')),
-- Nesting.
(7, 'nested 70 deep in a row', id(7)::uuid,
    up(7, '[{"t":"shop.sales","r":{"id":7,"total":7,"note":' || repeat('[', 70) || repeat(']', 70) || '}}]')),
(8, 'nested 100,000 deep, unclosed', id(8)::uuid, up(8, repeat('[', 100000))),
(9, 'objects nested 100,000 deep', id(9)::uuid, up(9, repeat('{"a":', 100000) || '1' || repeat('}', 100000))),
-- Size.
(10, '1,000,001 rows', id(10)::uuid, up(10, '[' || repeat('0,', 1000000) || '0]')),
(11, 'over max_upload_bytes', id(11)::uuid,
    up(11, '[{"t":"shop.notes","r":{"id":"big","body":"' || repeat('x', 16 * 1024 * 1024) || '"}}]')),
(12, 'a key too big for the index', id(12)::uuid,
    up(12, '[{"t":"shop.notes","r":{"id":"' || (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 320) i) || '"}}]')),
(13, 'a 100 kB table name', id(13)::uuid, up(13, '[{"t":"shop.' || repeat('x', 100000) || '","r":{"id":13}}]')),
(14, 'a 1 MB value (a value: filed)', id(14)::uuid,
    up(14, '[{"t":"shop.sales","r":{"id":14,"total":14,"note":"' || repeat('x', 1000000) || '"}}]')),
-- Not UTF-8.
(15, 'Latin-1 in a value', id(15)::uuid, up_with(15, '[{"t":"shop.sales","r":{"id":15,"total":1,"note":"caf', '\xe9', '"}}]}')),
(16, 'overlong UTF-8', id(16)::uuid, up_with(16, '[{"t":"shop.sales","r":{"id":16,"total":1,"note":"', '\xc0af', '"}}]}')),
(17, 'a surrogate encoded in UTF-8', id(17)::uuid, up_with(17, '[{"t":"shop.sales","r":{"id":17,"total":1,"note":"', '\xeda080', '"}}]}')),
(18, 'a lone surrogate escape', id(18)::uuid, up(18, '[{"t":"shop.sales","r":{"id":18,"total":1,"note":"\ud800"}}]')),
(19, 'invalid UTF-8 in a table name', id(19)::uuid, up_with(19, '[{"t":"shop.', '\xff', '","r":{"id":19}}]}')),
(20, 'UTF-16', NULL, '\xfffe7b002200760022003a0031007d00'),
-- NUL.
(21, 'a NUL byte in a string', id(21)::uuid, up_with(21, '[{"t":"shop.sales","r":{"id":21,"total":1,"note":"a', '\x00', 'b"}}]}')),
(22, 'a message, a NUL byte, anything', id(22)::uuid,
    up(22, '[]') || '\x00'::bytea || up(22, '[{"t":"shop.sales","r":{"id":22,"total":1}}]')),
(23, '\u0000 in a value', id(23)::uuid, up(23, '[{"t":"shop.notes","r":{"id":"n23","body":"a\u0000b"}}]')),
(24, '\u0000 in a key', id(24)::uuid, up(24, '[{"t":"shop.notes","r":{"id":"a\u0000b","body":"x"}}]')),
(25, '\u0000 in a table name', id(25)::uuid, up(25, '[{"t":"shop.\u0000","r":{"id":25}}]')),
(26, '\u0000 in an untaken row', id(26)::uuid,
    up(26, '[]', ',"untaken":[{"seq":1,"t":"shop.products","k":{"id":1},"why":"a\u0000b"}]')),
(27, '\u0000 in a scope name', id(27)::uuid,
    up(27, '[]', ',"holds":{"all\u0000":{"through":1,"fp":"' || repeat('0', 64) || '","n":0}}')),
(28, 'an escaped backslash before u0000 (a value: filed)', id(28)::uuid,
    up(28, '[{"t":"shop.notes","r":{"id":"n28","body":"a\\u0000b"}}]')),
-- The envelope's fields of the wrong type.
(29, 'no version', id(29)::uuid, convert_to(format('{"id":"%s","rows":[]}', id(29)), 'UTF8')),
(30, 'the version as a string', NULL, convert_to(format('{"v":"1","id":"%s","rows":[]}', id(30)), 'UTF8')),
(31, 'the id as a number', NULL, convert_to('{"v":1,"id":31,"rows":[]}', 'UTF8')),
(32, 'SQL for an id', NULL, convert_to($${"v":1,"id":"'; DROP TABLE shop.sales; --","rows":[]}$$, 'UTF8')),
(33, 'rows as an object', id(33)::uuid, up(33, '{}')),
(34, 'a row that is a number', id(34)::uuid, up(34, '[34]')),
(35, 'a row without its table', id(35)::uuid, up(35, '[{"r":{"id":35,"total":1}}]')),
(36, 'a row that is a list', id(36)::uuid, up(36, '[{"t":"shop.sales","r":[36,1]}]')),
(37, 'applied as a string', id(37)::uuid, up(37, '[]', ',"applied":"37"')),
(38, 'applied past 2^63', id(38)::uuid, up(38, '[]', ',"applied":9223372036854775808')),
(39, 'a fingerprint that is not hex', id(39)::uuid, up(39, '[]', ',"holds":{"all":{"through":1,"fp":"zz","n":1}}')),
(40, 'an untaken row at seq -1', id(40)::uuid,
    up(40, '[]', ',"untaken":[{"seq":-1,"t":"shop.products","k":{"id":1},"why":"no"}]')),
-- Rows of the wrong types, or keyed wrong: each kept with the database's reason.
(41, 'a fractional integer key', id(41)::uuid, up(41, '[{"t":"shop.sales","r":{"id":41.5,"total":1}}]')),
(42, 'text for a number', id(42)::uuid, up(42, '[{"t":"shop.sales","r":{"id":42,"total":"forty-two"}}]')),
(43, 'an object for a number', id(43)::uuid, up(43, '[{"t":"shop.sales","r":{"id":{"n":43},"total":1}}]')),
(44, 'a key beyond int', id(44)::uuid, up(44, '[{"t":"shop.sales","r":{"id":12345678901234567890,"total":1}}]')),
(45, 'a number beyond numeric(10, 2)', id(45)::uuid, up(45, '[{"t":"shop.sales","r":{"id":45,"total":1e300}}]')),
(46, 'the key of another table', id(46)::uuid,
    up(46, '[{"t":"shop.sales","r":{"register_id":"00000000-0000-0000-0000-0000000000a1","counted":1}}]')),
(47, 'a catalog row', id(47)::uuid, up(47, '[{"t":"shop.products","r":{"id":1,"name":"free tea"}}]')),
(48, 'another register''s drawer', id(48)::uuid,
    up(48, '[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000b1","counted":0}}]')),
(49, 'a new drawer for another register', id(49)::uuid,
    up(49, '[{"t":"shop.drawers","r":{"register_id":"00000000-0000-0000-0000-0000000000c1","counted":0}}]')),
-- SQL where identifiers and values go: never spliced, so it is a name that does not sync or a
-- value stored as it came.
(50, 'SQL in a table name', id(50)::uuid, up(50, '[{"t":"shop.sales; DROP TABLE shop.sales; --","r":{"id":50}}]')),
(51, 'a quoted table name', id(51)::uuid, up(51, '[{"t":"\"shop\".\"sales\"","r":{"id":51,"total":1}}]')),
(52, 'a system catalog', id(52)::uuid, up(52, '[{"t":"pg_catalog.pg_authid","r":{"rolname":"evil","rolsuper":true}}]')),
(53, 'the engine''s own table', id(53)::uuid, up(53, '[{"t":"sync.codec","r":{"id":1,"kind":"record"}}]')),
(54, 'SQL in a column name (kept: no such column)', id(54)::uuid,
    up(54, '[{"t":"shop.sales","r":{"id":54,"total":1,"note\") VALUES (1); DROP TABLE shop.sales; --":"x"}}]')),
(55, 'SQL in values (stored as it came)', id(55)::uuid,
    up(55, $$[{"t":"shop.notes","r":{"id":"x'); DROP TABLE shop.notes; --","body":"' OR '1'='1"}}]$$)),
-- Duplicates.
(56, 'a member twice in a row', id(56)::uuid, up(56, '[{"t":"shop.sales","r":{"id":56,"id":57,"total":1}}]')),
(57, 'the id twice', id(57)::uuid, convert_to(format('{"v":1,"id":"%s","id":"%s","rows":[]}', id(57), id(58)), 'UTF8')),
(58, 'one key twice, other content (the first is filed)', id(58)::uuid,
    up(58, '[{"t":"shop.sales","r":{"id":58,"total":1}},{"t":"shop.sales","r":{"id":58,"total":2}}]')),
(59, 'a key the server has (insert-if-absent: unchanged)', id(59)::uuid,
    up(59, '[{"t":"shop.sales","r":{"id":100,"total":999,"note":"hostile"}}]')),
-- Upload ids used again with other content: answered again, as the first time; not filed.
(60, 'a filed upload''s id, other rows', id(55)::uuid, up(55, '[{"t":"shop.notes","r":{"id":"n60","body":"again"}}]')),
(61, 'the id of an upload with a row kept, other rows', id(47)::uuid, up(47, '[{"t":"shop.sales","r":{"id":61,"total":1}}]')),
(62, 'a cut short upload''s id, now whole', id(4)::uuid, up(4, '[{"t":"shop.sales","r":{"id":4,"total":4}}]')),
-- A later protocol version: the one ERROR (send it again after the upgrade); nothing kept.
(63, 'a later version', NULL, convert_to(format('{"v":3,"id":"%s","rows":[]}', id(63)), 'UTF8')),
(64, 'a version past 2^64', id(64)::uuid, convert_to(format('{"v":99999999999999999999,"id":"%s","rows":[]}', id(64)), 'UTF8')),
-- Reports of what it holds: only of scopes it belongs to.
(65, '100,000 scope names it does not belong to', id(65)::uuid,
    up(65, '[{"t":"shop.notes","r":{"id":"n65","body":"and a row"}}]', ',"holds":{' || (SELECT string_agg(format('"s%s":{"through":1,"fp":"%s","n":0}', i, repeat('0', 64)), ',')
                                  FROM generate_series(1, 100000) i) || '}')),
-- Columns the table lacks: the row is kept, naming them, until they exist; never filed without them.
(66, 'a column the table lacks', id(66)::uuid, up(66, '[{"t":"shop.sales","r":{"id":66,"total":1,"bogus":1}}]')),
(67, 'a column that differs in case', id(67)::uuid, up(67, '[{"t":"shop.sales","r":{"id":67,"total":1,"Note":"x"}}]')),
-- Numbers past double's range reach numeric columns exactly; one that fits no column keeps its row alone.
(68, 'numbers past double''s range', id(68)::uuid,
    up(68, '[{"t":"shop.readings","r":{"id":68,"value":1e400}},{"t":"shop.readings","r":{"id":69,"value":-12345678901234567890123456789.000000000000000000001}},{"t":"shop.sales","r":{"id":68,"total":1e400}}]')),
-- A both table without a row policy: a register changes its own rows alone.
(69, 'another register''s assignment', id(69)::uuid, up(69, '[{"t":"shop.assignments","r":{"id":30,"status":"hijacked"}}]')),
(70, 'a new assignment (whose would it be?)', id(70)::uuid, up(70, '[{"t":"shop.assignments","r":{"id":32,"status":"mine now"}}]')),
(71, 'its own assignment, beside another''s', id(71)::uuid,
    up(71, '[{"t":"shop.assignments","r":{"id":31,"status":"done"}},{"t":"shop.assignments","r":{"id":30,"status":"done too"}}]')),
-- A number no double holds cannot go down to a replica (which reads numbers as doubles): in a
-- table whose rows go down it is that row's reason; the rest is filed.
(72, 'a number past double''s range in a table whose rows go down', id(72)::uuid,
    up(72, '[{"t":"shop.scores","r":{"id":72,"register_id":"00000000-0000-0000-0000-0000000000a1","score":1e400}},{"t":"shop.scores","r":{"id":73,"register_id":"00000000-0000-0000-0000-0000000000a1","score":2.5}}]'));

-- What changes outside what receive writes for the relay (set_aside, answer, upload): the app's
-- tables and the relay's state.
CREATE FUNCTION state() RETURNS TABLE (what text, digest text) LANGUAGE sql AS $$
    SELECT 'shop.products', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM shop.products t
    UNION ALL SELECT 'shop.sales', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM shop.sales t
    UNION ALL SELECT 'shop.notes', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM shop.notes t
    UNION ALL SELECT 'shop.readings', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM shop.readings t
    UNION ALL SELECT 'shop.scores', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM shop.scores t
    UNION ALL SELECT 'shop.assignments', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM shop.assignments t
    UNION ALL SELECT 'shop.drawers', md5(coalesce(string_agg(t::text, ',' ORDER BY t.register_id), '')) FROM shop.drawers t
    UNION ALL SELECT 'shop.registers', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM shop.registers t
    UNION ALL SELECT 'sync.codec', md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) FROM sync.codec t
    UNION ALL SELECT 'sync.replica', md5(coalesce(string_agg(format('%s %s %s %s %s', t.id, t.gen, t.live,
                     t.next_seq, t.applied), ',' ORDER BY t.id), '')) FROM sync.replica t
    UNION ALL SELECT 'sync.delivery', md5(coalesce(string_agg(format('%s %s %s', t.replica, t.gen,
                     t.refusals), ',' ORDER BY t.replica), '')) FROM sync.delivery t
    UNION ALL SELECT 'sync.member', md5(coalesce(string_agg(format('%s %s %s %s', t.replica, t.scope, t.sent,
                     t.confirmed), ',' ORDER BY t.replica, t.scope), '')) FROM sync.member t
    UNION ALL SELECT 'sync.outbox', md5(coalesce(string_agg(format('%s %s', t.replica, t.seq), ','
                     ORDER BY t.replica, t.seq), '')) FROM sync.outbox t
    UNION ALL SELECT 'sync.confirmation', count(*)::text FROM sync.confirmation
    UNION ALL SELECT 'sync.holding', count(*)::text FROM sync.holding
$$;
-- Long text shortened for the expected output, with its length.
CREATE FUNCTION short(t text) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN length(t) > 160 THEN left(t, 120) || format('... (%s characters)', length(t)) ELSE t END $$;

-- One case: the route's receive of the message from the hostile register, then what was kept
-- (as it came: the whole message, or the row {"t", "r"}), what was answered, what else changed.
CREATE FUNCTION run_case(message bytea, upload uuid,
                         OUT status text, OUT kept text, OUT answered text, OUT changed text)
LANGUAGE plpgsql AS $$
DECLARE
    kept_after bigint := (SELECT coalesce(max(id), 0) FROM sync.set_aside);
    answers_after bigint := (SELECT coalesce(max(id), 0) FROM sync.answer);
    before jsonb := (SELECT jsonb_object_agg(what, digest) FROM state());
BEGIN
    BEGIN
        SET LOCAL ROLE hostile_route;
        status := sync.receive('00000000-0000-0000-0000-0000000000a1', message);
        RESET ROLE;
    EXCEPTION WHEN OTHERS THEN
        status := format('ERROR %s: %s', SQLSTATE, SQLERRM);
    END;
    SELECT string_agg(format('%s %s %s %s: %s [%s]', s.kind, r.label, coalesce(c.table_name, '-'),
                             coalesce(short(s.key::text), '-'), short(s.reason),
                             CASE WHEN s.body = message THEN 'the message as it came'
                                  ELSE short(convert_from(s.body, 'UTF8')) END), E'\n' ORDER BY s.id)
    INTO kept
    FROM sync.set_aside s LEFT JOIN sync.codec c ON c.id = s.codec
    LEFT JOIN shop.registers r ON r.id = s.replica
    WHERE s.id > kept_after;
    SELECT string_agg(format('%s %s %s, kept %s', a.kind, r.label,
                             CASE WHEN a.payload->>'upload' = upload::text THEN 'its id'
                                  ELSE a.payload->>'upload' END,
                             coalesce((SELECT string_agg(format('%s %s', coalesce(nullif(short(e->>'t'), ''), '(the message)'),
                                                                short((e->'k')::text)), '; ' ORDER BY i)
                                       FROM jsonb_array_elements(a.payload->'kept') WITH ORDINALITY AS x(e, i)),
                                      'nothing')), E'\n' ORDER BY a.id)
    INTO answered
    FROM sync.answer a LEFT JOIN shop.registers r ON r.id = a.replica
    WHERE a.id > answers_after;
    SELECT coalesce(string_agg(s.what, ', ' ORDER BY s.what), 'nothing') INTO changed
    FROM state() s WHERE s.digest IS DISTINCT FROM before->>s.what;
END
$$;

\x on
SELECT c.n, c.name, octet_length(c.message) AS bytes, r.*
FROM (SELECT * FROM cases ORDER BY n OFFSET 0) c, LATERAL run_case(c.message, c.upload) r;
\x off

-- What was filed: only the cases that say so, as they came.
SELECT id, total, short(note) AS note FROM shop.sales ORDER BY id;
SELECT short(id) AS id, body FROM shop.notes ORDER BY id;
SELECT id, value FROM shop.readings ORDER BY id;
SELECT id, score FROM shop.scores ORDER BY id;
SELECT a.id, r.label, a.status FROM shop.assignments a LEFT JOIN shop.registers r ON r.id = a.register_id ORDER BY a.id;
SELECT r.label, d.counted, d.opened_by FROM shop.drawers d JOIN shop.registers r ON r.id = d.register_id ORDER BY 1;
SELECT * FROM shop.products;
-- The receiver's role and settings ended with each call.
SELECT current_user = session_user AS own_role, current_setting('shop.register', true) AS register;

-- The relay sends every answer to the hostile register, one filed message per upload id it could
-- read (a case sent again under an id whose answer still waits is answered by that one), and
-- nothing to the bystander.
SELECT provisioned, forgotten FROM sync.pass();
SELECT r.label, o.kind, count(*) AS messages,
       count(DISTINCT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->>'upload') AS uploads
FROM sync.outbox o JOIN shop.registers r ON r.id = o.replica GROUP BY 1, 2 ORDER BY 1, 2;
-- The cases with an id that were not answered: none.
SELECT c.n, c.name FROM cases c
WHERE c.upload IS NOT NULL AND NOT EXISTS (
    SELECT FROM sync.outbox o WHERE o.kind = 'filed'
      AND convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->>'upload' = c.upload::text)
ORDER BY c.n;

-- On its retry timer the relay files again what was kept and may be filed now, as the route that
-- sent it: the message that was over max_upload_bytes, now that the limit is raised, is filed;
-- the rest waits for a change of what filing depends on. After one (a deploy, here a comment),
-- everything is tried again and kept again for the same reasons (another register's drawer
-- included).
SET magic_sync.max_upload_bytes = '32MB';
SELECT * FROM sync.retry_set_aside();
SELECT s.tries, s.filed_as, count(*) AS kept FROM sync.set_aside s GROUP BY 1, 2 ORDER BY 1, 2;
CREATE TEMP TABLE reasons_before AS SELECT id, reason FROM sync.set_aside;
COMMENT ON SCHEMA shop IS 'deployed again';
SELECT * FROM sync.retry_set_aside();
RESET magic_sync.max_upload_bytes;
SELECT s.tries, s.filed_as, count(*) AS kept, count(*) FILTER (WHERE s.reason <> b.reason) AS new_reasons
FROM sync.set_aside s JOIN reasons_before b USING (id) GROUP BY 1, 2 ORDER BY 1, 2;
SELECT short(id) AS id, short(body) AS body FROM shop.notes ORDER BY id;
SELECT r.label, d.counted FROM shop.drawers d JOIN shop.registers r ON r.id = d.register_id ORDER BY 1;

\c regression
DROP DATABASE hostile_test;
DROP ROLE hostile_route;
