-- Every routine and view a user calls says what it is for (src/state/comments.sql), as \df+ and
-- \dv+ show it. The documented roles' surface is found from the privileges themselves: each
-- routine in schema sync that PUBLIC, sync_sender, sync_receiver or sync_monitor may execute, and
-- each relation they may read, listed with whether it has a comment. A grant added without a
-- comment changes this list and fails the test.
SELECT r.role, p.oid::regprocedure AS routine,
       obj_description(p.oid, 'pg_proc') IS NOT NULL AS commented
FROM pg_proc p
CROSS JOIN (VALUES ('public'), ('sync_sender'), ('sync_receiver'), ('sync_monitor')) AS r(role)
WHERE p.pronamespace = 'sync'::regnamespace
  AND has_function_privilege(r.role, p.oid, 'EXECUTE')
ORDER BY r.role, p.oid::regprocedure::text;

SELECT r.role, c.oid::regclass AS relation,
       obj_description(c.oid, 'pg_class') IS NOT NULL AS commented
FROM pg_class c
CROSS JOIN (VALUES ('public'), ('sync_sender'), ('sync_receiver'), ('sync_monitor')) AS r(role)
WHERE c.relnamespace = 'sync'::regnamespace AND c.relkind IN ('r', 'v', 'm')
  AND has_table_privilege(r.role, c.oid, 'SELECT')
ORDER BY r.role, c.oid::regclass::text;

-- The extension's owner calls the rest of what the README documents. Each view in schema sync,
-- and each of these routines, without a comment (none expected):
SELECT c.oid::regclass AS view_without_comment
FROM pg_class c
WHERE c.relnamespace = 'sync'::regnamespace AND c.relkind IN ('v', 'm')
  AND obj_description(c.oid, 'pg_class') IS NULL
ORDER BY 1;

SELECT documented AS routine_without_comment
FROM unnest(ARRAY[
    'sync.replicas(regclass, text, text, name)', 'sync.catalog(regclass, text, name[])',
    'sync.record(regclass, text, name[], name[])',
    'sync."both"(regclass, text, name[], name[], name[])',
    'sync.senders(regprocedure, regprocedure)', 'sync.drop(regclass)', 'sync."check"()',
    'sync.audience_sql(integer, text, text)', 'sync.note_keys(bytea)',
    'sync.note_keys(bytea, integer)', 'sync.pass()', 'sync.relay()', 'sync.start_relay()',
    'sync.prune()', 'sync.setting(text)', 'sync.message(uuid, bigint)',
    'sync.retry_set_aside()', 'sync.retry_uploads(integer, interval)', 'sync.expected(uuid)',
    'sync.audit()', 'sync.verify(uuid)'
]::regprocedure[]) AS documented
WHERE obj_description(documented, 'pg_proc') IS NULL;

SELECT obj_description('sync.repair'::regclass, 'pg_class') IS NOT NULL AS repair_commented;
