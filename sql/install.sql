-- The extension installs its schema, roles and privileges.
CREATE EXTENSION magic_sync;

SELECT extversion, extrelocatable, extnamespace::regnamespace AS schema
FROM pg_extension WHERE extname = 'magic_sync';

-- The tables of the engine's state.
SELECT c.relname, c.relkind
FROM pg_class c
WHERE c.relnamespace = 'sync'::regnamespace AND c.relkind IN ('r', 'v')
ORDER BY c.relname;

-- Roles for the sender and the receiver exist, and cannot log in by themselves.
SELECT rolname, rolcanlogin FROM pg_roles
WHERE rolname IN ('sync_sender', 'sync_receiver') ORDER BY rolname;

-- PUBLIC can read, write and call nothing in sync or sync_internal. A routine of sync is for users;
-- one of sync_internal is the engine's own.
SELECT count(*) AS public_table_grants
FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
WHERE c.relnamespace = 'sync'::regnamespace AND a.grantee = 0;
SELECT p.pronamespace::regnamespace AS schema, p.proname,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_can_execute
FROM pg_proc p WHERE p.pronamespace IN ('sync'::regnamespace, 'sync_internal'::regnamespace) ORDER BY 1, 2;
SELECT has_schema_privilege('public', 'sync', 'USAGE') AS public_schema_usage,
       has_schema_privilege('public', 'sync_internal', 'USAGE') AS public_internal_usage;

-- Every function that may read the catalog pins its search_path.
SELECT p.proname FROM pg_proc p
WHERE p.pronamespace IN ('sync'::regnamespace, 'sync_internal'::regnamespace)
  AND NOT EXISTS (SELECT FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')
  AND p.provolatile <> 'i'  -- immutable wire and fingerprint functions read no catalog
  AND p.prokind <> 'p'      -- a procedure with SET cannot commit: sync.relay() qualifies its names
  AND p.prosqlbody IS NULL  -- a body in SQL's standard form is resolved when it is created
  AND p.oid <> 'sync.capture()'::regprocedure  -- runs no SQL: a SET would cost every write
  AND p.oid <> 'sync.note_keys(bytea)'::regprocedure  -- resolves no name: types by oid
  AND p.oid <> 'sync.note_keys(bytea, int)'::regprocedure  -- the same
  AND p.oid <> 'sync_internal.encode_row(record, text[])'::regprocedure  -- resolves no name: a row's type by oid
  AND p.oid <> 'sync_internal.session_lives(int, timestamptz)'::regprocedure  -- resolves no name: reads shared memory
  AND p.oid <> 'sync_internal.row_travels(text, text, text, text)'::regprocedure  -- reads a setting, no name
  AND p.oid <> 'sync_internal.drops_fitting(text[], text[], text[])'::regprocedure  -- reads a setting, no name
  AND p.oid <> 'sync_internal.withheld_note(text, text, text, text)'::regprocedure  -- reads a setting, no name
  AND p.oid <> 'sync_internal.withheld_size(text, text, text, text)'::regprocedure  -- reads a setting, no name
  AND p.oid <> 'sync_internal.withheld_reason(text, text, text, text)'::regprocedure  -- reads a setting, no name
  AND p.oid <> 'sync.setting(text)'::regprocedure  -- reads a setting, no name
  AND p.oid <> 'sync_internal.history()'::regprocedure;  -- reads shared memory, no name

-- The extension cannot be moved to another schema.
ALTER EXTENSION magic_sync SET SCHEMA public;

-- Declarations are dumped with the database; state is not.
SELECT unnest(extconfig)::regclass AS dumped FROM pg_extension WHERE extname = 'magic_sync'
ORDER BY 1::text;

-- A database that is not UTF-8 is refused: its text would not hold what replicas send.
CREATE DATABASE latin1_test ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C';
\c latin1_test
CREATE EXTENSION magic_sync;
\c regression
DROP DATABASE latin1_test;
