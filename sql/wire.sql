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

-- The pass writes a row from its columns (sync_internal.encode_row): the same text as the truth
-- audit's way, PostgreSQL's to_json made canonical (sync_internal.canonical_row), for every column
-- type. Floats as their shortest exact text (1e-320, 1e+300, not to_jsonb's long decimals), -0 as
-- 0, NaN and the infinities as strings.
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
    (4, NULL, 'NaN', 'Infinity', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (5, -32768, 1e-7, 1.5e-300, 123456789012345678901234567890.123, NULL, NULL, NULL, NULL, NULL,
     '{"n": 1.10, "": 2, "aa": 3, "b": 4}', NULL, NULL, NULL),
    (6, NULL, 1e-45, '1e-320', 0.000, NULL, NULL, NULL, NULL, NULL,
     (repeat('[', 58) || repeat(']', 58))::jsonb, NULL, NULL, NULL),
    (7, NULL, -3.4e38, 1e300, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
SELECT id, sync_internal.encode_row(w, '{}') = sync_internal.canonical_row(to_json(w), '{}') AS same,
       sync_internal.encode_row(w, '{}') FROM wide w WHERE id <> 6 ORDER BY id;
SELECT id, sync_internal.encode_row(w, '{}') = sync_internal.canonical_row(to_json(w), '{}') AS same,
       length(sync_internal.encode_row(w, '{}')) FROM wide w WHERE id = 6;
SELECT id, sync_internal.encode_row(w, '{f4,t,nonesuch}') = sync_internal.canonical_row(to_json(w), '{f4,t,nonesuch}')
       AS same_without_hidden FROM wide w ORDER BY id;
-- What each float's text reads back as: the same float.
SELECT id, (sync_internal.encode_row(w, '{}')::jsonb->>'f8')::float8 = f8 AS f8_exact,
       (sync_internal.encode_row(w, '{}')::jsonb->>'f4')::float4 = f4 AS f4_exact
FROM wide w WHERE f8 IS NOT NULL ORDER BY id;
-- A column nested deeper than a row may be: refused with the exact error, both ways.
UPDATE wide SET j = (repeat('[', 59) || repeat(']', 59))::jsonb WHERE id = 6;
SELECT sync_internal.encode_row(w, '{}') FROM wide w WHERE id = 6;
SELECT sync_internal.canonical_row(to_json(w), '{}') FROM wide w WHERE id = 6;
-- Other types: arrays (floats in them exact, nested by dimension), json (parsed), intervals,
-- domains, composites, as to_json writes them. (A jsonb JSON null and an array not from 1 are
-- withheld: sql/pass.sql.)
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE DOMAIN ratio AS float8;
CREATE TYPE pair AS (x float8, label text);
CREATE TEMP TABLE other (id int, tags int[], doc json, span interval, p positive, r ratio,
                         fs float8[], grid float4[], two pair, pairs pair[]);
INSERT INTO other (id, tags, doc, span, p, r, fs, grid, two, pairs) VALUES
    (1, '{1,2}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (2, NULL, '{"b": 1, "a": [2.50]}', NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (3, NULL, NULL, '1 day', NULL, NULL, NULL, NULL, NULL, NULL),
    (4, NULL, NULL, NULL, 7, 1e300, NULL, NULL, NULL, NULL),
    (5, NULL, NULL, NULL, NULL, NULL, '{1e-320,-0,NaN,NULL,0.1}', '{{1.5,2},{3,1e-45}}', NULL, NULL),
    (6, '{7,8}', NULL, NULL, NULL, NULL, '{}', NULL, ROW(1e300, 'a "b"'),
     ARRAY[ROW(0.1, NULL)::pair, NULL]),
    (7, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
SELECT id, sync_internal.encode_row(o, '{}') = sync_internal.canonical_row(to_json(o), '{}') AS same,
       sync_internal.encode_row(o, '{}') AS written FROM other o ORDER BY id;
SELECT id, sync_internal.encode_row(i, '{tags}') = sync_internal.canonical_row(to_json(i), '{tags}') AS same
FROM item i ORDER BY id;

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
