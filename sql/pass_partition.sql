-- partitioned_by: no row crosses a partition. Two companies, each with a register; a broadcast
-- row reaches only the registers of its own company, and so does a store's price.
CREATE DATABASE partition_test;
\c partition_test
CREATE EXTENSION magic_sync;
\set SHOW_CONTEXT never
CREATE TABLE registers (id uuid PRIMARY KEY, label text NOT NULL, company_id int NOT NULL,
                        store_id int NOT NULL, active boolean NOT NULL DEFAULT true);
CREATE TABLE products (company_id int, id int, name text NOT NULL, PRIMARY KEY (company_id, id));
CREATE TABLE prices (company_id int, store_id int, product_id int, price numeric(10, 2),
                     PRIMARY KEY (company_id, store_id, product_id));
SELECT sync.replicas('registers', 'registers', live => 'active', partitioned_by => 'company_id');
SELECT sync.catalog('products');
SELECT sync.catalog('prices', "to" => 'store_id = store_id');
-- As sync.declarations says it.
SELECT "table", kind, audience FROM sync.declarations;
INSERT INTO registers VALUES
    ('00000000-0000-0000-0000-0000000000a1', 'acme-1', 1, 10),
    ('00000000-0000-0000-0000-0000000000b1', 'bolt-1', 2, 10);
INSERT INTO products VALUES (1, 1, 'acme tea'), (2, 1, 'bolt tea');
-- Both companies have a store 10: the same store number must not leak across.
INSERT INTO prices VALUES (1, 10, 1, 2.50), (2, 10, 1, 9.90);
SELECT notes, provisioned, messages FROM sync.pass();

SELECT g.label, c->>'scope' AS scope, r->'r' AS row
FROM sync.outbox o JOIN registers g ON g.id = o.replica
CROSS JOIN LATERAL jsonb_array_elements(convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb->'chunks') c
CROSS JOIN LATERAL jsonb_array_elements(c->'rows') r
ORDER BY g.label, scope;

-- A register moved to the other company starts over there (a new generation, reset first).
UPDATE sync.outbox SET sent_at = now();
UPDATE registers SET company_id = 2 WHERE label = 'acme-1';
SELECT notes, provisioned, messages FROM sync.pass();
SELECT g.label, r.gen, r.partition, m->'reset' AS reset, c->>'scope' AS scope, x->'r' AS row
FROM sync.outbox o JOIN registers g ON g.id = o.replica JOIN sync.replica r ON r.id = o.replica
CROSS JOIN LATERAL (SELECT convert_from(sync.message(o.replica, o.seq), 'UTF8')::jsonb AS m) msg
CROSS JOIN LATERAL jsonb_array_elements(m->'chunks') c
CROSS JOIN LATERAL jsonb_array_elements(c->'rows') x
WHERE o.sent_at IS NULL ORDER BY g.label, scope;

\c regression
DROP DATABASE partition_test;
