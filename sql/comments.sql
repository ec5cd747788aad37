-- Every routine and view a user calls says what it is for (src/state/comments.sql), as \df+ and
-- \dv+ show it. The documented roles' surface is found from the privileges themselves: each
-- routine in schema sync that PUBLIC, sync_sender, sync_receiver or sync_monitor may execute, and
-- each relation they may read, listed with whether it has a comment. A grant added without a
-- comment changes this list and fails the test.
SELECT r.role, p.oid::regprocedure AS routine,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
FROM pg_proc p
CROSS JOIN (VALUES ('public'), ('sync_sender'), ('sync_receiver'), ('sync_monitor')) AS r(role)
WHERE p.pronamespace IN ('sync'::regnamespace, 'sync_internal'::regnamespace)
  AND has_function_privilege(r.role, p.oid, 'EXECUTE')
ORDER BY r.role, p.oid::regprocedure::text;

SELECT r.role, c.oid::regclass AS relation,
       obj_description(c.oid, 'pg_class') IS NOT NULL AS commented
FROM pg_class c
CROSS JOIN (VALUES ('public'), ('sync_sender'), ('sync_receiver'), ('sync_monitor')) AS r(role)
WHERE c.relnamespace = 'sync'::regnamespace AND c.relkind IN ('r', 'v', 'm')
  AND has_table_privilege(r.role, c.oid, 'SELECT')
ORDER BY r.role, c.oid::regclass::text;

-- Schema sync holds what users call, schema sync_internal what only the engine calls. Each view
-- and each routine of sync without a comment (none expected):
SELECT c.oid::regclass AS view_without_comment
FROM pg_class c
WHERE c.relnamespace = 'sync'::regnamespace AND c.relkind IN ('v', 'm')
  AND obj_description(c.oid, 'pg_class') IS NULL
ORDER BY 1;

SELECT p.oid::regprocedure AS routine_without_comment
FROM pg_proc p
WHERE p.pronamespace = 'sync'::regnamespace AND obj_description(p.oid, 'pg_proc') IS NULL
ORDER BY 1;
SELECT count(*) AS routines_of_sync FROM pg_proc p WHERE p.pronamespace = 'sync'::regnamespace;

SELECT obj_description('sync.repair'::regclass, 'pg_class') IS NOT NULL AS repair_commented;
