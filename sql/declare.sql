-- Declaring what syncs: every declaration, every refusal with its exact message, redeclaring,
-- dropping, and sync.check() after the schema changed under a declaration.
\set SHOW_CONTEXT never
CREATE SCHEMA shop;
CREATE TABLE shop.stores (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE shop.registers (
    id uuid PRIMARY KEY, store_id int NOT NULL, company_id int NOT NULL DEFAULT 1,
    active boolean NOT NULL DEFAULT true, label text);
CREATE TABLE shop.products (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2));
CREATE TABLE shop.prices (
    store_id int, product_id int, price numeric(10, 2), PRIMARY KEY (store_id, product_id));
CREATE TABLE shop.promotions (id int PRIMARY KEY, store_code text, text text);
CREATE TABLE shop.sales (
    id uuid PRIMARY KEY, register_id uuid NOT NULL, product_id int NOT NULL, qty int NOT NULL,
    company_id int);
CREATE TABLE shop.drawers (
    register_id uuid PRIMARY KEY, counted numeric(10, 2), closed_at timestamptz, opened_by text);
CREATE TABLE shop.notes_without_key (body text);
CREATE TABLE shop.payloads (id int PRIMARY KEY, doc json, body jsonb);
CREATE VIEW shop.product_names AS SELECT id, name FROM shop.products;
CREATE FUNCTION shop.register_company(register uuid) RETURNS jsonb
    LANGUAGE sql AS $$ SELECT jsonb_build_object('company_id', company_id) FROM shop.registers WHERE id = register $$;
CREATE FUNCTION shop.as_company(known jsonb) RETURNS void
    LANGUAGE sql AS $$ SELECT set_config('app.company', known->>'company_id', true) $$;
CREATE FUNCTION shop.register_name(register uuid) RETURNS text
    LANGUAGE sql AS $$ SELECT label FROM shop.registers WHERE id = register $$;
CREATE FUNCTION shop.two_args(a jsonb, b jsonb) RETURNS void LANGUAGE sql AS $$ SELECT $$;

-- The replicas relation ------------------------------------------------------------------------
SELECT sync.replicas('shop.stores', 'stores');
SELECT sync.replicas('shop.drawers', 'drawers');
SELECT sync.replicas('shop.registers', 'Registers!');
SELECT sync.replicas('shop.registers', 'registers', live => 'active =');
SELECT sync.replicas('shop.registers', 'registers', live => 'label');
SELECT sync.replicas('shop.registers', 'registers', live => 'activ');
SELECT sync.replicas('shop.registers', 'registers', partitioned_by => 'tenant');
SELECT sync.replicas('shop.registers', 'registers', live => 'active');
SELECT relation, relation_name, name, live, partitioned_by FROM sync.replica_set;

-- Codecs: refusals -----------------------------------------------------------------------------
SELECT sync_internal.codec('shop.products', 'mirror');
SELECT sync.catalog('shop.product_names');
SELECT sync.catalog('shop.notes_without_key');
SELECT sync.catalog('shop.products', "to" => 'nobody here');
SELECT sync.record('shop.sales', "to" => 'registr_id');
SELECT sync.record('shop.sales', "to" => 'product_id');
SELECT sync.catalog('shop.prices', "to" => 'store_id = shop_id');
SELECT sync.catalog('shop.promotions', "to" => 'store_code = store_id');
SELECT sync.catalog('shop.products', columns => ARRAY['id', 'nmae']);
SELECT sync.catalog('shop.products', columns => ARRAY['name', 'price']);
SELECT sync.record('shop.sales', stamp => ARRAY['compny_id']);
SELECT sync_internal.codec('shop.products', 'catalog', replica_columns => ARRAY['name']);
SELECT sync_internal.codec('shop.products', 'catalog', stamp => ARRAY['name']);
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['countd']);
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['register_id', 'counted']);
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted'],
                 columns => ARRAY['register_id', 'closed_at']);
SELECT sync.catalog('shop.payloads');
SELECT sync.catalog('shop.payloads', columns => ARRAY['id', 'doc']);
-- Nothing was declared by the refusals.
SELECT count(*) AS codecs FROM sync.codec;

-- Codecs: declarations -------------------------------------------------------------------------
SELECT sync.catalog('shop.products');
SELECT sync.catalog('shop.prices', "to" => 'store_id = store_id');
SELECT sync.record('shop.sales', stamp => ARRAY['company_id']);
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted', 'closed_at']);
SELECT table_name, kind, "to", columns, replica_columns, stamp, key_columns
FROM sync.codec ORDER BY id;

-- Each declared table has its four capture triggers, and the replicas table has them too.
SELECT tgrelid::regclass AS "table", tgname, tgtype
FROM pg_trigger WHERE tgfoid = 'sync.capture()'::regprocedure
ORDER BY tgrelid::regclass::text, tgname;

-- Redeclaring replaces the declaration and keeps the codec's id.
SELECT id AS products_codec FROM sync.codec WHERE table_name = 'shop.products' \gset
SELECT sync.catalog('shop.products', columns => ARRAY['id', 'name']);
SELECT id = :products_codec AS same_id, kind, "to", columns FROM sync.codec WHERE table_name = 'shop.products';
SELECT sync.catalog('shop.products');

-- Dropping: the declaration and triggers go; an undeclared table is refused.
SELECT sync.drop('shop.drawers');
SELECT count(*) AS drawer_triggers FROM pg_trigger WHERE tgrelid = 'shop.drawers'::regclass;
SELECT sync.drop('shop.drawers');
SELECT sync.both('shop.drawers', "to" => 'register_id', replica_columns => ARRAY['counted', 'closed_at']);

-- Senders: refusals, then the declaration.
SELECT sync.senders(known => 'shop.register_name(uuid)'::regprocedure);
SELECT sync.senders(filing => 'shop.two_args(jsonb, jsonb)'::regprocedure);
SELECT sync.senders(known => 'shop.register_company(uuid)'::regprocedure,
                    filing => 'shop.as_company(jsonb)'::regprocedure);
SELECT known, filing FROM sync.sender_rule;

-- Partitioning: a synced table must have the partition column.
SELECT sync.replicas('shop.registers', 'registers', live => 'active', partitioned_by => 'company_id');
SELECT sync.replicas('shop.registers', 'registers', live => 'active');

-- What is declared, as psql shows it: every kind of audience, columns named or all.
SELECT * FROM sync.declarations;

-- A declarative partitioned table syncs like any other.
CREATE TABLE shop.events (id int, at date NOT NULL, what text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
CREATE TABLE shop.events_2026 PARTITION OF shop.events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE TABLE shop.events_2027 PARTITION OF shop.events FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
SELECT sync.record('shop.events');
SELECT table_name, kind, key_columns FROM sync.codec WHERE table_name = 'shop.events';

-- sync.check(): nothing wrong now...
SELECT * FROM sync.check();
-- A schema change that would break a declaration is refused, saying why and what to do first.
ALTER TABLE shop.drawers DROP COLUMN counted;
ALTER TABLE shop.registers RENAME COLUMN active TO enabled;
ALTER TABLE shop.registers RENAME COLUMN store_id TO shop_id;
ALTER TABLE shop.prices ALTER COLUMN store_id TYPE bigint;
ALTER TABLE shop.drawers DROP CONSTRAINT drawers_pkey;
ALTER TABLE shop.products ADD COLUMN spec json;
-- A dropped table stops syncing, as with sync.drop().
BEGIN;
CREATE TABLE shop.scratch (id int PRIMARY KEY);
SELECT sync.catalog('shop.scratch');
DROP TABLE shop.scratch;
SELECT table_name FROM sync.codec WHERE table_name = 'shop.scratch';
SELECT table_name FROM sync.dropped_codec WHERE table_name = 'shop.scratch';
ROLLBACK;
-- ...then the schema changes under the declarations where no event trigger runs (as with
-- session_replication_role = replica): sync.check() says what broke and how to fix it.
BEGIN;
SET LOCAL session_replication_role = replica;
ALTER TABLE shop.promotions RENAME TO promos;
SELECT sync.catalog('shop.promos');
ALTER TABLE shop.promos RENAME TO promotions_2026;
ALTER TABLE shop.drawers DROP COLUMN counted;
DROP TRIGGER magic_sync_truncate ON shop.sales;
ALTER TABLE shop.registers RENAME COLUMN active TO enabled;
ALTER TABLE shop.registers RENAME COLUMN store_id TO shop_id;
CREATE TABLE shop.scratch (id int PRIMARY KEY);
SELECT sync.catalog('shop.scratch');
DROP TABLE shop.scratch;
SELECT * FROM sync.check();
ROLLBACK;
SELECT * FROM sync.check();
