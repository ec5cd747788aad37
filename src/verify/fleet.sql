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
                 'raise it), or bring its number within a double''s range; planned again when '
                 'the row or the limit changes.'
        ELSE 'Deploy a fix (its replica could not take this row: a bug of the replica or of the '
             'declaration); tried again every magic_sync.retry_every.'
    END
$$;

CREATE FUNCTION sync.fleet(slowest int DEFAULT 10) RETURNS jsonb
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH status AS MATERIALIZED (
    -- >>> THE STATE OF A REPLICA, DERIVED HERE UNTIL sync.status HAS ITS OWN `state` AND
    -- `state_detail` COLUMNS. This CTE is the only place the page's states are made; once
    -- sync.status has them, it becomes `SELECT s.* FROM sync.status s`.
    SELECT s.*,
           CASE WHEN NOT s.live THEN 'forgotten'
                WHEN s.backoff_seconds IS NOT NULL OR s.last_error IS NOT NULL THEN 'failing'
                WHEN s.sync IN ('repairing', 'storm') THEN 'repairing'
                WHEN s.lacks > 0 THEN 'lacking rows'
                WHEN s.outbox > 0 THEN 'catching up'
                WHEN s.sync = 'in sync' THEN 'in sync'
                ELSE 'waiting for its report' END AS state,
           CASE WHEN NOT s.live
                    THEN 'Not live: it is sent nothing. Make it live in the replicas relation to '
                         'provision it again.'
                WHEN s.backoff_seconds IS NOT NULL OR s.last_error IS NOT NULL
                    THEN format('Its deliveries fail (%s): %s messages wait, the oldest %s s; '
                                'the next try %s. Check the device and its line.',
                                coalesce(s.last_error, 'no error said'), s.outbox,
                                round(coalesce(s.oldest_unsent_seconds, 0)::numeric),
                                CASE WHEN s.backoff_seconds IS NULL THEN 'is due now'
                                     ELSE format('in %s s', round(s.backoff_seconds::numeric, 1)) END)
                WHEN s.sync = 'storm'
                    THEN 'Its repairs keep failing (sync.repair): look at its log.'
                WHEN s.sync = 'repairing'
                    THEN 'What it holds differs from what it should: a repair is under way. Wait.'
                WHEN s.lacks > 0
                    THEN format('It lacks %s rows (%s): see sync.set_aside.', s.lacks, s.lacks_why)
                WHEN s.outbox > 0
                    THEN format('%s messages are being delivered, the oldest %s s old. Wait.',
                                s.outbox, round(coalesce(s.oldest_unsent_seconds, 0)::numeric))
                WHEN s.sync = 'in sync' THEN 'It holds what it should.'
                ELSE 'It has not yet confirmed what it was sent: wait for its next upload.' END
               AS state_detail
    FROM sync.status s
    -- <<< END OF THE DERIVED STATE
),
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
