-- Uploads of 100 rows through sync.receive against the same rows by one plain multi-row INSERT,
-- round after round in turn, one transaction per upload as an up route commits them. Both tables
-- are declared the same way, so both pay the capture triggers.
\set ON_ERROR_STOP on
\pset tuples_only on
CREATE EXTENSION magic_sync;
CREATE SCHEMA bench;
CREATE TABLE bench.registers (id uuid PRIMARY KEY);
CREATE TABLE bench.sales_up (id uuid PRIMARY KEY, register_id uuid NOT NULL, total numeric(10, 2),
                             note text, sold_at timestamptz);
CREATE TABLE bench.sales_plain (LIKE bench.sales_up INCLUDING ALL);
SELECT sync.replicas('bench.registers', 'registers');
SELECT sync.record('bench.sales_up');
SELECT sync.record('bench.sales_plain');
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

CREATE TABLE bench.timing (round int, way text, seconds float8);

-- Builds both forms of round r's rows before the clock starts.
CREATE FUNCTION bench.rows(r int, rows int) RETURNS TABLE (upload bytea, insert text)
LANGUAGE sql AS $$
    WITH x AS (
        SELECT gen_random_uuid() AS id, '00000000-0000-0000-0000-0000000000a1'::uuid AS register_id,
               round((random() * 100)::numeric, 2) AS total, 'sale ' || r || '.' || n AS note,
               now() AS sold_at
        FROM generate_series(1, rows) n)
    SELECT convert_to(json_build_object('v', 1, 'id', gen_random_uuid(), 'rows',
                      json_agg(json_build_object('t', 'bench.sales_up', 'r', to_jsonb(x))))::text, 'UTF8'),
           'INSERT INTO bench.sales_plain (id, register_id, total, note, sold_at) VALUES '
           || string_agg(format('(%L, %L, %s, %L, %L)', id, register_id, total, note, sold_at), ', ')
    FROM x
$$;

CREATE PROCEDURE bench.run(rounds int, rows int) LANGUAGE plpgsql AS $$
DECLARE
    upload bytea;
    statement text;
    started timestamptz;
BEGIN
    FOR r IN 1..rounds LOOP
        SELECT * INTO upload, statement FROM bench.rows(r, rows);
        COMMIT;
        -- Each commit wakes the relay worker, whose pass then runs beside whatever is measured
        -- next: the two ways take turns going first, so neither always runs beside it.
        FOR turn IN 0..1 LOOP
            IF (r + turn) % 2 = 0 THEN
                started := clock_timestamp();
                EXECUTE statement;
                COMMIT;
                INSERT INTO bench.timing VALUES (r, 'plain INSERT', extract(epoch FROM clock_timestamp() - started));
            ELSE
                started := clock_timestamp();
                PERFORM sync.receive('00000000-0000-0000-0000-0000000000a1', upload);
                COMMIT;
                INSERT INTO bench.timing VALUES (r, 'sync.receive', extract(epoch FROM clock_timestamp() - started));
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- A warm-up (plans, caches), then the measured rounds.
CALL bench.run(20, :rows);
TRUNCATE bench.timing;
CALL bench.run(:rounds, :rows);

SELECT (SELECT count(*) FROM bench.sales_up) = (SELECT count(*) FROM bench.sales_plain) AS same_rows,
       (SELECT count(*) FROM sync.set_aside) AS set_aside;
\pset tuples_only off
\pset footer off
SELECT way, count(*) AS uploads,
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) * 1000)::numeric, 3) AS median_ms,
       round(:rows / percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds)) AS rows_per_s
FROM bench.timing GROUP BY way ORDER BY way;
SELECT round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE way = 'plain INSERT')
              / percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE way = 'sync.receive'))::numeric, 2)
       AS "receive / plain (rate, goal >= 0.5)"
FROM bench.timing;
