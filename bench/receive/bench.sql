-- Uploads of 100 rows through sync.receive, as JSON and gzip-compressed, against the same rows by
-- one plain multi-row INSERT, round after round in turn, one transaction per upload as an up
-- route commits them. The tables are declared the same way, so all pay the capture triggers.
-- Run by run.sh after setup.sql, once bench.input holds every round's rows in each form.
\set ON_ERROR_STOP on
\pset tuples_only on
CREATE TABLE bench.timing (round int, way text, seconds float8);

CREATE PROCEDURE bench.run(first int, last int) LANGUAGE plpgsql AS $$
DECLARE
    input record;
    started timestamptz;
    way text;
BEGIN
    FOR r IN first..last LOOP
        SELECT * INTO input FROM bench.input WHERE round = r;
        -- Each commit wakes the relay worker, whose pass then runs beside whatever is measured
        -- next: the three ways take turns going first, so none always runs beside it.
        FOR turn IN 0..2 LOOP
            way := (ARRAY['plain INSERT', 'sync.receive', 'sync.receive, gzip'])[(r + turn) % 3 + 1];
            started := clock_timestamp();
            IF way = 'plain INSERT' THEN
                EXECUTE input.insert;
            ELSIF way = 'sync.receive' THEN
                PERFORM sync.receive('00000000-0000-0000-0000-0000000000a1', input.upload);
            ELSE
                PERFORM sync.receive('00000000-0000-0000-0000-0000000000a1', input.upload_gzip);
            END IF;
            COMMIT;
            INSERT INTO bench.timing VALUES (r, way, extract(epoch FROM clock_timestamp() - started));
        END LOOP;
    END LOOP;
END
$$;

-- A warm-up (plans, caches), then the measured rounds, each on rows of its own.
CALL bench.run(1, 20);
TRUNCATE bench.timing;
CALL bench.run(21, 20 + :rounds);

SELECT (SELECT count(*) FROM bench.sales_up) = (SELECT count(*) FROM bench.sales_plain)
       AND (SELECT count(*) FROM bench.sales_gzip) = (SELECT count(*) FROM bench.sales_plain) AS same_rows,
       (SELECT count(*) FROM sync.set_aside) AS set_aside;
\pset tuples_only off
\pset footer off
SELECT round(avg(octet_length(upload))) AS upload_bytes, round(avg(octet_length(upload_gzip))) AS gzip_bytes
FROM bench.input;
SELECT way, count(*) AS uploads,
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) * 1000)::numeric, 3) AS median_ms,
       round(:rows / percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds)) AS rows_per_s
FROM bench.timing GROUP BY way ORDER BY way;
SELECT round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE way = 'plain INSERT')
              / percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE way = 'sync.receive'))::numeric, 2)
       AS "receive / plain (rate, goal >= 0.5)",
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE way = 'sync.receive')
              / percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE way = 'sync.receive, gzip'))::numeric, 2)
       AS "receive gzip / receive (rate)"
FROM bench.timing;
