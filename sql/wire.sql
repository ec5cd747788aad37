-- Canonical JSON and key hashes of jsonb values, as the relay encodes every row it plans. The
-- expected output was made by the build that wrote jsonb out as text and parsed it again; the
-- walk over jsonb's binary form must give every byte of it.
CREATE TEMP TABLE sample (name text, value jsonb);
INSERT INTO sample VALUES
    ('null', 'null'),
    ('true', 'true'),
    ('false', 'false'),
    ('zero', '0'),
    ('minus zero', '-0'),
    ('integer', '42'),
    ('negative', '-17'),
    ('int64 max', '9223372036854775807'),
    ('int64 min', '-9223372036854775808'),
    ('past uint64', '18446744073709551616'),
    ('scale kept', '12.50'),
    ('exponent', '1E+3'),
    ('small exponent', '1.5e-7'),
    ('many digits', '123456789012345678901234567890.123'),
    ('string', '"plain"'),
    ('escapes', '"a\"b\\c\/d\b\f\n\r\t"'),
    ('controls', '"\u0001\u001f\u007f"'),
    ('unicode', '"é ü 日本 😀"'),
    ('escaped unicode', '"\u00e9\ud83d\ude00"'),
    ('empty string', '""'),
    ('empty array', '[]'),
    ('empty object', '{}'),
    ('array', '[1, "two", null, true, [3, [4]], {"b": 1, "a": 2}]'),
    ('keys by bytes', '{"b": 1, "aa": 2, "a": 3, "ab": 4, "é": 5, "Z": 6, "": 7, "a b": 8}'),
    ('nested', '{"z": {"y": {"x": [{"w": 1, "v": [2.0, -3]}]}}, "a": []}'),
    ('spaced', '{ "k" : [ 1 , 2 ] , "j" : { } }');
SELECT name, sync_internal.canonical(value), encode(sync_internal.key_hash('items', value), 'hex') AS k
FROM sample ORDER BY name;

-- A row as the pass encodes it: to_jsonb of the table's row.
CREATE TEMP TABLE item (id bigint, name text, qty int, price numeric(10, 2), ratio float8,
                        ok boolean, tags text[], at timestamptz, day date, doc jsonb, code char(4));
SET timezone = 'UTC';
INSERT INTO item VALUES
    (1, 'Tea "green"', 3, 2.50, 0.1, true, '{a,"b c"}', '2026-12-01 10:00:00.25+00', '2026-12-01',
     '{"n": 1.10, "s": "x"}', 'ab'),
    (2, NULL, -1, 1000, 1e20, false, '{}', '1999-01-01 00:00:00+00', '1999-12-31', '[]', NULL),
    (3, 'snow ☃', 0, 0.00, 'NaN', NULL, NULL, NULL, NULL, NULL, 'abcd'),
    (4, '', 2147483647, 99999999.99, '-Infinity', true, '{NULL}', 'infinity', '-infinity',
     '"scalar"', '');
SELECT id, sync_internal.canonical(to_jsonb(i)) FROM item i ORDER BY id;

-- Refused as before: nesting deeper than a row may be inside a message.
SELECT sync_internal.canonical((repeat('[', 70) || repeat(']', 70))::jsonb);
SELECT length(sync_internal.canonical((repeat('[', 59) || repeat(']', 59))::jsonb));
-- A number no double can hold is written as it is, past a long double too: such a row is withheld
-- (sync_internal.row_travels), and its key still hashes.
SELECT length(sync_internal.canonical(('1' || repeat('0', 400))::jsonb));
SELECT length(sync_internal.canonical(('1' || repeat('0', 5000))::jsonb));
SELECT sync_internal.canonical(('2' || repeat('0', 308))::jsonb) = '2' || repeat('0', 308) AS as_written;
SELECT length(sync_internal.key_hash('items', ('{"id": 1' || repeat('0', 400) || '}')::jsonb));
SELECT sync_internal.row_travels('all', 'items', '{"id":1}', '{"id":1,"n":1' || repeat('0', 400) || '}');
SELECT sync_internal.row_travels('all', 'items', '{"id":1}', '{"id":1,"n":1' || repeat('0', 300) || '}');

-- The pass writes a row from its columns where it can (sync_internal.encode_row): the same text as
-- through to_jsonb, for every column type it writes; NULL leaves the row to to_jsonb.
CREATE TEMP TABLE wide (id int2, big int8, f4 float4, f8 float8, n numeric, v varchar(10),
                        u uuid, ts timestamp, tz timestamptz, d date, j jsonb, b bool, t text,
                        c char(3));
INSERT INTO wide VALUES
    (1, 9223372036854775807, 1.5, 0.1, 12.50, 'tea', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
     '2026-12-01 10:00:00.123456', '2026-12-01 10:00:00+02', '2026-12-01', '{"b": [1, {"a": null}]}',
     true, E'line\nbreak "quoted" \\ é 😀', 'ab'),
    (2, -9223372036854775808, 3.4e38, 1e20, 'NaN', '', NULL, 'infinity', '-infinity', 'infinity',
     '"scalar"', false, E'\u0001', NULL),
    (3, 0, '-0', '-0', 'Infinity', NULL, NULL, '1999-01-01', '2000-02-29 23:59:59.999999+00',
     '0044-03-15 BC', '[]', NULL, '', 'xyz'),
    (4, NULL, 'NaN', 'Infinity', '-Infinity', NULL, NULL, NULL, NULL, NULL, 'null', NULL, NULL, NULL),
    (5, -32768, 1e-7, 1.5e-300, 123456789012345678901234567890.123, NULL, NULL, NULL, NULL, NULL,
     '{"n": 1.10, "": 2, "aa": 3, "b": 4}', NULL, NULL, NULL),
    (6, NULL, NULL, '-Infinity', 0.000, NULL, NULL, NULL, NULL, NULL,
     (repeat('[', 58) || repeat(']', 58))::jsonb, NULL, NULL, NULL);
SELECT id, sync_internal.encode_row(w, '{}') = sync_internal.canonical(to_jsonb(w)) AS same,
       sync_internal.encode_row(w, '{}') FROM wide w WHERE id < 6 ORDER BY id;
SELECT id, sync_internal.encode_row(w, '{}') = sync_internal.canonical(to_jsonb(w)) AS same FROM wide w WHERE id = 6;
SELECT id, sync_internal.encode_row(w, '{f4,t,nonesuch}') = sync_internal.canonical(to_jsonb(w) - '{f4,t,nonesuch}'::text[])
       AS same_without_hidden FROM wide w ORDER BY id;
-- Left to to_jsonb: a column nested deeper than a row may be (to_jsonb's way refuses it), and
-- column types written another way (arrays, json, intervals, domains).
UPDATE wide SET j = (repeat('[', 59) || repeat(']', 59))::jsonb WHERE id = 6;
SELECT sync_internal.encode_row(w, '{}') IS NULL AS left_to_to_jsonb FROM wide w WHERE id = 6;
SELECT sync_internal.canonical(to_jsonb(w)) FROM wide w WHERE id = 6;
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TEMP TABLE other (id int, tags int[], doc json, span interval, p positive);
INSERT INTO other VALUES (1, '{1,2}', NULL, NULL, NULL), (2, NULL, '{"a": 1, "a": 2}', NULL, NULL),
    (3, NULL, NULL, '1 day', NULL), (4, NULL, NULL, NULL, 7), (5, NULL, NULL, NULL, NULL);
SELECT id, sync_internal.encode_row(o, '{}') AS written, sync_internal.canonical(to_jsonb(o)) AS through_to_jsonb
FROM other o ORDER BY id;
SELECT id, sync_internal.encode_row(i, '{tags}') = sync_internal.canonical(to_jsonb(i) - 'tags') AS same FROM item i
ORDER BY id;

-- A row's version hash and its fingerprint element, as the pass computes them: the SHA-256 of
-- the canonical text's UTF-8 bytes, and of k ‖ v; both as PostgreSQL's sha256 gives them.
SELECT id, sync_internal.row_hash(sync_internal.encode_row(w, '{}')) = sha256(convert_to(sync_internal.encode_row(w, '{}'), 'UTF8'))
       AS same_row_hash,
       sync_internal.fp_element(sync_internal.key_hash('wide', jsonb_build_object('id', id)),
                       sync_internal.row_hash(sync_internal.encode_row(w, '{}')))
       = sha256(sync_internal.key_hash('wide', jsonb_build_object('id', id))
                || sha256(convert_to(sync_internal.encode_row(w, '{}'), 'UTF8'))) AS same_element
FROM wide w WHERE id < 6 ORDER BY id;
SELECT encode(sync_internal.row_hash('{"id":1,"name":"snow ☃"}'), 'hex');
SELECT sync_internal.fp_element('\x00'::bytea, sha256('x'));
