-- The error bridge between C++ exceptions and ereport, through self-test functions of the library.
CREATE SCHEMA selftest;
CREATE FUNCTION selftest.throw(text) RETURNS void
    AS 'magic_sync', 'magic_sync_selftest_throw' LANGUAGE C STRICT;
CREATE FUNCTION selftest.throw_std(text) RETURNS void
    AS 'magic_sync', 'magic_sync_selftest_throw_std' LANGUAGE C STRICT;
CREATE FUNCTION selftest.bad_alloc() RETURNS void
    AS 'magic_sync', 'magic_sync_selftest_bad_alloc' LANGUAGE C;
CREATE FUNCTION selftest.guarded_error() RETURNS text
    AS 'magic_sync', 'magic_sync_selftest_guarded_error' LANGUAGE C;
CREATE FUNCTION selftest.guarded_error_escapes() RETURNS text
    AS 'magic_sync', 'magic_sync_selftest_guarded_error_escapes' LANGUAGE C;
CREATE FUNCTION selftest.read_cell(query text, as_type text) RETURNS text
    AS 'magic_sync', 'magic_sync_selftest_read_cell' LANGUAGE C STRICT;
CREATE FUNCTION selftest.read_column(query text, name text) RETURNS text
    AS 'magic_sync', 'magic_sync_selftest_read_column' LANGUAGE C STRICT;
CREATE FUNCTION selftest.bound(kind text) RETURNS text
    AS 'magic_sync', 'magic_sync_selftest_bound' LANGUAGE C STRICT;
CREATE FUNCTION selftest.throw_inside_pg_try() RETURNS text
    AS 'magic_sync', 'magic_sync_selftest_throw_inside_pg_try' LANGUAGE C;
CREATE FUNCTION selftest.error_objects(statement text) RETURNS text
    AS 'magic_sync', 'magic_sync_selftest_error_objects' LANGUAGE C STRICT;
CREATE FUNCTION selftest.run(statement text) RETURNS void
    AS 'magic_sync', 'magic_sync_selftest_run' LANGUAGE C STRICT;
CREATE FUNCTION selftest.is_transient(sqlstate text) RETURNS boolean
    AS 'magic_sync', 'magic_sync_selftest_is_transient' LANGUAGE C STRICT;

-- A magic_sync::Error becomes an ERROR with its message, SQLSTATE, detail and hint...
SELECT selftest.throw('the C++ side says no');
-- ...and the session goes on.
SELECT 1 AS still_here;

-- Any std::exception becomes an internal ERROR carrying its message.
SELECT selftest.throw_std('a logic error');

-- std::bad_alloc becomes an out-of-memory ERROR.
SELECT selftest.bad_alloc();

-- A PostgreSQL ERROR inside a guarded call reaches C++ as an exception; the destructors of the
-- three objects on the way run.
SELECT selftest.guarded_error();

-- Not caught in C++, it reaches the client with its original message and detail...
SELECT selftest.guarded_error_escapes();

-- ...and every error keeps its SQLSTATE: data_exception, internal_error, out_of_memory,
-- division_by_zero.
\set VERBOSITY sqlstate
SELECT selftest.throw('the C++ side says no');
SELECT selftest.throw_std('a logic error');
SELECT selftest.bad_alloc();
SELECT selftest.guarded_error_escapes();
\set VERBOSITY default

-- A C++ exception thrown out of a PG_TRY block (which guard() refuses at compile time) still
-- reaches the client as an ERROR, and the next error finds the error stack it should: the body's
-- bridge put PG_exception_stack back.
SELECT selftest.throw_inside_pg_try();
SELECT 1 / 0 AS next_error;
SELECT 1 AS still_here;

-- A transaction aborted by a bridged error rolls back as usual and the session is usable.
BEGIN;
CREATE TABLE selftest.kept (x int);
SELECT selftest.throw('inside a transaction');
ROLLBACK;
SELECT to_regclass('selftest.kept') AS rolled_back;

-- A result cell of a boolean or integer column is read as itself, not parsed from its text...
SELECT selftest.read_cell('SELECT true', 'flag') AS t,
       selftest.read_cell('SELECT NULL::boolean', 'flag') AS null_flag,
       selftest.read_cell('SELECT 9223372036854775807::bigint', 'integer') AS bigint,
       selftest.read_cell('SELECT (-7)::int', 'integer') AS int,
       selftest.read_cell('SELECT 3::smallint', 'integer') AS smallint;
-- ...and reading one as a type its column does not have is an error, not a guess.
SELECT selftest.read_cell('SELECT ''t''::text', 'flag');
SELECT selftest.read_cell('SELECT 42::numeric', 'integer');
SELECT selftest.read_cell('SELECT NULL::bigint', 'integer');

-- A bytea cell is its bytes, a text[] or integer array cell its elements.
SELECT selftest.read_cell($$SELECT '\x00ff0a'::bytea$$, 'bytes') AS bytea,
       selftest.read_cell($$SELECT ''::bytea$$, 'bytes') AS empty_bytea,
       selftest.read_cell($$SELECT ARRAY['a', NULL, 'b,c', '{', '', '"']$$, 'elements') AS text_array,
       selftest.read_cell($$SELECT '{}'::text[]$$, 'elements') AS empty_array,
       selftest.read_cell($$SELECT ARRAY[9223372036854775807, -1]$$, 'integers') AS bigint_array,
       selftest.read_cell($$SELECT '{{1,2},{3,4}}'::int[]$$, 'integers') AS int_array;
SELECT selftest.read_cell($$SELECT 'abc'::text$$, 'bytes');
SELECT selftest.read_cell($$SELECT NULL::bytea$$, 'bytes');
SELECT selftest.read_cell($$SELECT ARRAY[1, NULL]::bigint[]$$, 'integers');

-- A row finds a cell by its column's name; a name the result does not have is an error.
SELECT selftest.read_column('SELECT 1 AS a, 2 AS b, NULL AS c', 'b') AS b,
       selftest.read_column('SELECT 1 AS a, 2 AS b, NULL AS c', 'c') AS c;
SELECT selftest.read_column('SELECT 1 AS a, 2 AS b', 'B');

-- A parameter is bound with its own type: jsonb, text[], bigint[], bytea.
SELECT selftest.bound('jsonb') AS jsonb, selftest.bound('text[]') AS text_array,
       selftest.bound('bigint[]') AS bigint_array, selftest.bound('bytea') AS bytea;

-- A PostgreSQL error caught in C++ names the objects it is about: a unique violation its table
-- and constraint, a foreign key violation its own, a NOT NULL violation its column, a domain's
-- check its type.
CREATE TABLE selftest.parent (id int CONSTRAINT parent_key PRIMARY KEY);
CREATE TABLE selftest.child (id int PRIMARY KEY,
                             parent int NOT NULL CONSTRAINT child_parent REFERENCES selftest.parent);
CREATE DOMAIN selftest.positive AS int CHECK (VALUE > 0);
INSERT INTO selftest.parent VALUES (1);
SELECT selftest.error_objects('INSERT INTO selftest.parent VALUES (1)') AS unique_violation;
SELECT selftest.error_objects('INSERT INTO selftest.child VALUES (1, 2)') AS foreign_key_violation;
SELECT selftest.error_objects('INSERT INTO selftest.child VALUES (1, NULL)') AS not_null_violation;
SELECT selftest.error_objects('SELECT (-1)::selftest.positive') AS domain_check;
SELECT selftest.error_objects('SELECT 1') AS none;
-- Not caught, the error reaches the client with the objects it names, as PostgreSQL raised it.
DO $$
DECLARE
    schema_name text;
    table_name text;
    constraint_name text;
BEGIN
    PERFORM selftest.run('INSERT INTO selftest.child VALUES (1, 2)');
EXCEPTION WHEN foreign_key_violation THEN
    GET STACKED DIAGNOSTICS schema_name = SCHEMA_NAME, table_name = TABLE_NAME,
                            constraint_name = CONSTRAINT_NAME;
    RAISE NOTICE 'schema %, table %, constraint %', schema_name, table_name, constraint_name;
END $$;

-- Which errors are of the moment (pg::is_transient): the pass, filing and the retry end at them,
-- to be tried again whole, and set nothing aside; any other is the row's reason.
SELECT code, name, selftest.is_transient(code) AS transient FROM (VALUES
    ('40001', 'serialization_failure'), ('40P01', 'deadlock_detected'),
    ('53200', 'out_of_memory'), ('53100', 'disk_full'), ('57014', 'query_canceled'),
    ('57P01', 'admin_shutdown'), ('57P02', 'crash_shutdown'), ('57P04', 'database_dropped'),
    ('58030', 'io_error'), ('55P03', 'lock_not_available'),
    ('58P01', 'undefined_file'), ('58P02', 'duplicate_file'), ('55000', 'object_not_in_prerequisite_state'),
    ('XX000', 'internal_error'), ('XX001', 'data_corrupted'), ('08006', 'connection_failure'),
    ('22P02', 'invalid_text_representation'), ('23503', 'foreign_key_violation'),
    ('23514', 'check_violation'), ('42501', 'insufficient_privilege'), ('P0001', 'raise_exception'))
    AS e(code, name);

DROP SCHEMA selftest CASCADE;

