-- One filing backend, many upload shapes: a device that sends a different subset of a table's
-- columns each time gets a statement planned for each subset. Those plans are not kept for the
-- backend's life (only a bounded few of the statements built at run time are), so 2,000 uploads
-- of distinct column subsets leave the backend's memory where it was.
CREATE DATABASE upload_shapes_test;
\c upload_shapes_test
CREATE EXTENSION magic_sync;
CREATE SCHEMA shapes;
CREATE TABLE shapes.devices (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE shapes.wide (id int PRIMARY KEY, c1 int, c2 int, c3 int, c4 int, c5 int, c6 int,
                          c7 int, c8 int, c9 int, c10 int, c11 int);
SELECT sync.replicas('shapes.devices', 'devices', live => 'active');
SELECT sync.record('shapes.wide');
INSERT INTO shapes.devices VALUES ('00000000-0000-0000-0000-0000000000d1', true);
SELECT provisioned FROM sync.pass();

-- Upload n (1 to 2047) files row n with the columns c1..c11 whose bits are set in n: each
-- upload a shape of its own. Each upload is its own transaction, as a route files them.
CREATE PROCEDURE file_shapes(first int, last int) LANGUAGE plpgsql AS $$
BEGIN
    FOR n IN first..last LOOP
        PERFORM sync.receive('00000000-0000-0000-0000-0000000000d1', convert_to(format(
            '{"v":1,"id":"10000000-0000-0000-0000-%s","rows":[{"t":"shapes.wide","r":%s}]}',
            lpad(n::text, 12, '0'),
            (SELECT jsonb_object_agg(name, value) FROM (SELECT 'id' AS name, n AS value
             UNION ALL SELECT 'c' || b, b FROM generate_series(1, 11) b
             WHERE n & (1 << (b - 1)) <> 0) m)), 'UTF8'));
        COMMIT;
    END LOOP;
END $$;
CREATE FUNCTION backend_bytes() RETURNS bigint LANGUAGE sql AS $$
    SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts $$;

-- Warm: the backend has read the catalogs and planned what every upload runs.
CALL file_shapes(1, 100);
SELECT backend_bytes() AS before \gset
CALL file_shapes(101, 2047);
SELECT count(*) AS filed, count(DISTINCT (c1 IS NULL, c2 IS NULL, c3 IS NULL, c4 IS NULL,
       c5 IS NULL, c6 IS NULL, c7 IS NULL, c8 IS NULL, c9 IS NULL, c10 IS NULL, c11 IS NULL))
       AS shapes FROM shapes.wide;
-- Under 4 MB more after 1,947 more shapes (every plan kept: about 40 kB each, 80 MB in all).
SELECT backend_bytes() - :before < 4 * 1024 * 1024 AS bounded;
SELECT CASE WHEN backend_bytes() - :before >= 4 * 1024 * 1024
            THEN pg_size_pretty(backend_bytes() - :before) END AS grown_by;

\c regression
DROP DATABASE upload_shapes_test;
