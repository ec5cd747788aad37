-- The fleet at a glance (the sender's page, magic-sync-sender --metrics: GET / and /fleet.json) ----
--
-- One jsonb document: the replicas counted by state, the `slowest` live replicas (the worst state
-- first, failing before lacking rows before repairing before catching up before waiting for its
-- report before in sync, the longest lag first within one) with their lag, last error and what
-- their state means, the alarms (what the relay's report says needs someone, and
-- a relay that is not running), and what is set aside with what fixes it. One reading of
-- sync.status per call, which compares every replica's holdings: the sender reads it at most once
-- every few seconds, however many pages are open.

-- What fixes an item set aside of `kind` (an upload `waits_for_data`: a row it references has not
-- come, a limit may be raised), as sync_internal.report() says it for the relay's log.
CREATE FUNCTION sync_internal.set_aside_fix(kind text, waits_for_data boolean) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN kind = 'upload' AND waits_for_data
            THEN 'Wait: it is filed as it is once what it needs comes (a row it references, a '
                 'limit raised); tried again backed off.'
        WHEN kind = 'upload'
            THEN 'Deploy a fix (a grant, a policy, a declaration, a column''s type) or delete it '
                 'from sync.set_aside; tried again once something filing depends on changes.'
        WHEN kind = 'note'
            THEN 'Deploy a fix (a bug: the pass could not plan this change); tried again every '
                 'magic_sync.retry_every, or now with SELECT * FROM sync.retry_set_aside().'
        WHEN kind = 'row'
            THEN 'Withheld from its replicas: make the row fit magic_sync.bytes_per_message (or '
                 'raise it), bring its number within a double''s range, or store the value its '
                 'reason names so that it travels exactly; planned again when the row or the '
                 'limit changes.'
        ELSE 'Deploy a fix (its replica could not take this row: a bug of the replica or of the '
             'declaration); tried again every magic_sync.retry_every.'
    END
$$;

CREATE FUNCTION sync.fleet(slowest int DEFAULT 10) RETURNS jsonb
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH status AS MATERIALIZED (SELECT s.* FROM sync.status s),
states(state, ord) AS (
    VALUES ('failing', 1), ('lacking rows', 2), ('repairing', 3), ('catching up', 4),
           ('waiting for its report', 5), ('in sync', 6), ('forgotten', 7)),
ranked AS (
    SELECT s.*,
           greatest(coalesce(s.oldest_unsent_seconds, 0), coalesce(s.unconfirmed_seconds, 0))
               AS lag_seconds
    FROM status s),
health AS (SELECT * FROM sync.health)
SELECT jsonb_build_object(
    'at', now(),
    'replicas', (SELECT count(*) FROM status),
    'unsent', (SELECT coalesce(sum(s.outbox), 0) FROM status s WHERE s.live),
    'states', (SELECT jsonb_agg(jsonb_build_object('state', t.state, 'replicas', t.n) ORDER BY t.ord)
               FROM (SELECT t.state, t.ord, count(s.replica) AS n
                     FROM states t LEFT JOIN status s ON s.state = t.state
                     GROUP BY t.state, t.ord) t),
    'slowest', coalesce((
        SELECT jsonb_agg(jsonb_build_object(
                   'replica', r.replica, 'state', r.state, 'state_detail', r.state_detail,
                   'lag_seconds', round(r.lag_seconds::numeric, 1), 'outbox', r.outbox,
                   'backoff_seconds', round(r.backoff_seconds::numeric, 1),
                   'last_error', r.last_error, 'set_aside', r.set_aside, 'lacks', r.lacks)
                   ORDER BY r.ord, r.lag_seconds DESC, r.replica)
        FROM (SELECT r.*, t.ord FROM ranked r JOIN states t ON t.state = r.state
              WHERE r.live
              ORDER BY t.ord, r.lag_seconds DESC, r.replica
              LIMIT greatest(slowest, 0)) r), '[]'),
    'relay', (SELECT jsonb_build_object(
                  'running', h.relay_pid IS NOT NULL,
                  'last_pass_seconds', round(extract(epoch FROM now() - h.last_pass_at)::numeric, 1),
                  'notes_backlog', h.notes_backlog,
                  'oldest_note_seconds', round(h.oldest_note_seconds::numeric, 1),
                  'horizon_seconds', round(h.horizon_seconds::numeric, 1))
              FROM health h),
    'alarms', coalesce((
        SELECT jsonb_agg(jsonb_build_object('level', a.level, 'line', a.line) ORDER BY a.ord)
        FROM (SELECT 'WARNING' AS level,
                     'No relay is running for this database: nothing is planned. Put magic_sync '
                     'in shared_preload_libraries and the database in magic_sync.database, or '
                     'run CALL sync.relay() in a session of its own.' AS line, 0 AS ord
              FROM health h WHERE h.relay_pid IS NULL
              UNION ALL
              SELECT r.level, r.line, 1 FROM sync_internal.report() r) a), '[]'),
    'set_aside', jsonb_build_object(
        'items', (SELECT count(*) FROM sync.set_aside),
        'kinds', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'kind', k.kind, 'items', k.n, 'first_reason', k.reason, 'fix', k.fix)
                       ORDER BY k.kind, k.fix)
            FROM (SELECT a.kind, a.fix, count(*) AS n, min(a.reason) AS reason
                  FROM (SELECT s.kind, s.reason,
                               sync_internal.set_aside_fix(s.kind, s.next_try_at IS NOT NULL) AS fix
                        FROM sync.set_aside s) a
                  GROUP BY a.kind, a.fix) k), '[]'),
        'latest', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'id', s.id, 'kind', s.kind, 'replica', s.replica,
                       'table', coalesce(s.table_name, c.table_name), 'reason', s.reason,
                       'tries', s.tries, 'first_at', s.first_at,
                       'fix', sync_internal.set_aside_fix(s.kind, s.next_try_at IS NOT NULL))
                       ORDER BY s.last_try_at DESC, s.id DESC)
            FROM (SELECT * FROM sync.set_aside ORDER BY last_try_at DESC, id DESC LIMIT 20) s
            LEFT JOIN sync.codec c ON c.id = s.codec), '[]')))
$$;

REVOKE ALL ON FUNCTION sync.fleet(int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sync.fleet(int) TO sync_sender, sync_monitor;
