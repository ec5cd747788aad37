-- bench/receive's database: one register, three identical `record` tables (one per way an upload's
-- rows are written), and every round's rows built before any clock starts: as an upload's JSON
-- (its rows in bench.sales_up), as a plain INSERT (bench.sales_plain), and, for run.sh to
-- compress, as the same upload of bench.sales_gzip's.
\set ON_ERROR_STOP on
CREATE EXTENSION magic_sync;
CREATE SCHEMA bench;
CREATE TABLE bench.registers (id uuid PRIMARY KEY);
CREATE TABLE bench.sales_up (id uuid PRIMARY KEY, register_id uuid NOT NULL, total numeric(10, 2),
                             note text, sold_at timestamptz);
CREATE TABLE bench.sales_plain (LIKE bench.sales_up INCLUDING ALL);
CREATE TABLE bench.sales_gzip (LIKE bench.sales_up INCLUDING ALL);
SELECT sync.replicas('bench.registers', 'registers');
SELECT sync.record('bench.sales_up');
SELECT sync.record('bench.sales_plain');
SELECT sync.record('bench.sales_gzip');
INSERT INTO bench.registers VALUES ('00000000-0000-0000-0000-0000000000a1');
-- The relay worker (magic_sync.database = postgres) provisions the register.
DO $$
BEGIN
    FOR i IN 1..100 LOOP
        EXIT WHEN EXISTS (SELECT FROM sync.replica WHERE live);
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;

CREATE TABLE bench.input (round int PRIMARY KEY, upload bytea, upload_to_gzip bytea,
                          upload_gzip bytea, insert text);
INSERT INTO bench.input (round, upload, upload_to_gzip, insert)
SELECT r, f.upload, f.upload_to_gzip, f.insert
FROM generate_series(1, 20 + :rounds) r,
     LATERAL (
        WITH x AS (
            SELECT gen_random_uuid() AS id, '00000000-0000-0000-0000-0000000000a1'::uuid AS register_id,
                   round((random() * 100)::numeric, 2) AS total, 'sale ' || r || '.' || n AS note,
                   now() AS sold_at
            FROM generate_series(1, :rows) n),
        -- the same rows under other keys, for the plain INSERT and the gzip upload
        y AS (SELECT x.*, gen_random_uuid() AS plain_id, gen_random_uuid() AS gzip_id FROM x)
        SELECT convert_to(json_build_object('v', 1, 'id', gen_random_uuid(), 'rows',
                          json_agg(json_build_object('t', 'bench.sales_up', 'r',
                                   to_jsonb(y) - 'plain_id' - 'gzip_id')))::text, 'UTF8') AS upload,
               convert_to(json_build_object('v', 1, 'id', gen_random_uuid(), 'rows',
                          json_agg(json_build_object('t', 'bench.sales_gzip', 'r',
                                   jsonb_set(to_jsonb(y) - 'plain_id' - 'gzip_id', '{id}', to_jsonb(gzip_id)))))::text,
                          'UTF8') AS upload_to_gzip,
               'INSERT INTO bench.sales_plain (id, register_id, total, note, sold_at) VALUES '
               || string_agg(format('(%L, %L, %s, %L, %L)', plain_id, register_id, total, note, sold_at), ', ')
               AS insert
        FROM y) f;
