-- magic_sync 0.1.0 -> 0.2.0, the part before the install script. 0.1.0 is the release of
-- 2026-12-02 (commit 56f535c). The update sets 0.1.0's state aside, installs 0.2.0 whole (the
-- install script follows this part unchanged) and brings the state back (0.1.0--0.2.0.after.sql):
-- one script for every table, view and routine of 0.2.0, instead of a second copy of each.
\echo Use "ALTER EXTENSION magic_sync UPDATE TO '0.2.0'" to load this file. \quit

-- What 0.1.0 held moves to sync_0_1_0 (tables with their sequences, and the free-standing
-- sequences); its views and routines go, all in one statement each, so that they may depend on
-- one another. Not sync.capture(): the tables' capture triggers call it, and 0.2.0 replaces it
-- under the same name. A view or routine of the user's own that depends on one of 0.1.0's stops
-- the update with PostgreSQL's message naming it: drop it first, and create it again after.
CREATE SCHEMA sync_0_1_0;
DO $set_aside$
DECLARE
    extension oid := (SELECT e.oid FROM pg_extension e WHERE e.extname = 'magic_sync');
    names text;
    relation record;
BEGIN
    SELECT string_agg(c.oid::regclass::text, ', ') INTO names
    FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = extension AND d.deptype = 'e'
      AND d.classid = 'pg_class'::regclass AND c.relkind IN ('v', 'm');
    IF names IS NOT NULL THEN
        EXECUTE 'DROP VIEW ' || names;
    END IF;
    SELECT string_agg(p.oid::regprocedure::text, ', ') INTO names
    FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = extension AND d.deptype = 'e'
      AND d.classid = 'pg_proc'::regclass AND p.oid <> 'sync.capture()'::regprocedure;
    IF names IS NOT NULL THEN
        EXECUTE 'DROP ROUTINE ' || names;
    END IF;
    -- Statistics objects on the extension's tables (not members of it themselves) stay in their
    -- schema when their table moves, and the install script creates them again: they go (0.1.0
    -- has none; 0.2.0 has, for the update after it).
    SELECT string_agg(format('%I.%I', n.nspname, x.stxname), ', ') INTO names
    FROM pg_depend d JOIN pg_statistic_ext x ON x.stxrelid = d.objid
    JOIN pg_namespace n ON n.oid = x.stxnamespace
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = extension AND d.deptype = 'e'
      AND d.classid = 'pg_class'::regclass;
    IF names IS NOT NULL THEN
        EXECUTE 'DROP STATISTICS ' || names;
    END IF;
    FOR relation IN
        SELECT c.oid::regclass AS name, c.relkind
        FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
        WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = extension
          AND d.deptype = 'e' AND d.classid = 'pg_class'::regclass
          AND (c.relkind IN ('r', 'p')
               -- a sequence a column owns moves with its table
               OR c.relkind = 'S' AND NOT EXISTS (
                   SELECT FROM pg_depend o WHERE o.classid = 'pg_class'::regclass
                   AND o.objid = c.oid AND o.refclassid = 'pg_class'::regclass AND o.deptype = 'a'))
        ORDER BY c.oid
    LOOP
        EXECUTE format('ALTER %s %s SET SCHEMA sync_0_1_0',
                       CASE WHEN relation.relkind = 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                       relation.name);
    END LOOP;
END
$set_aside$;

