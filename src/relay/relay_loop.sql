-- The relay loop (docs/DESIGN.md §4): the worker and CALL sync.relay() run passes and, on their timers,
-- these functions. They run on the lock holder's session only.

-- Relays until cancelled, for hosts without shared_preload_libraries.
CREATE PROCEDURE sync.relay()
AS 'MODULE_PATHNAME', 'magic_sync_relay'
LANGUAGE C;

-- Starts a relay worker for this database; returns its pid.
CREATE FUNCTION sync.start_relay() RETURNS int
AS 'MODULE_PATHNAME', 'magic_sync_start_relay'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

-- Raises an alarm, the one way the relay does: a NOTIFY on channel magic_sync_alarm whose payload
-- is a JSON object {"alarm": name, "level": "WARNING" or "LOG", "replica": its uuid or null,
-- "detail": the line, "at": when}, for a listener to wire to a pager (README.md, "Alarms"), and
-- the line, which the relay logs at `severity` ("magic_sync relay: <line>"). Sent when the
-- relay's transaction commits. Names: backlog_not_draining, set_aside, provisioned_again,
-- state_drifted, repair_storm.
CREATE FUNCTION sync_internal.alarm(alarm text, severity text, detail text, replica uuid DEFAULT NULL)
RETURNS TABLE (level text, line text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_notify('magic_sync_alarm',
                     json_build_object('alarm', alarm.alarm, 'level', alarm.severity,
                                       'replica', alarm.replica,
                                       -- a NOTIFY payload holds less than 8000 bytes
                                       'detail', left(alarm.detail, 6000), 'at', now())::text);
    SELECT alarm.severity, alarm.detail;
$$;

-- What needs someone, one line each, saying whether to wait (the network) or deploy a fix (a bug).
CREATE FUNCTION sync_internal.report() RETURNS TABLE (level text, line text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    every interval := sync.setting('report_every')::interval;
    backlog bigint;
    oldest interval;
    stuck bigint;
    sample text;
BEGIN
    SELECT coalesce(sum(key_count), 0), now() - min(noted_at) INTO backlog, oldest FROM sync.note;
    IF oldest > every THEN
        RETURN QUERY SELECT * FROM sync_internal.alarm('backlog_not_draining', 'WARNING', format(
            '%s changes are waiting to be planned, the oldest for %s: the relay is behind. Wait '
            'while the backlog shrinks; if it does not, deploy a fix (look for relay errors above)',
            backlog, date_trunc('second', oldest)));
    END IF;
    SELECT count(*), string_agg(DISTINCT coalesce(d.last_error, 'no error yet'), '; ')
    INTO stuck, sample
    FROM sync.replica r
    LEFT JOIN sync.current_delivery d ON d.replica = r.id
    WHERE r.live AND EXISTS (SELECT FROM sync.outbox o WHERE o.replica = r.id AND o.sent_at IS NULL
                             AND o.created_at < now() - every);
    IF stuck > 0 THEN
        level := 'LOG';
        line := format('%s replicas have messages unsent for more than %s (%s): wait, the network '
                       'or the replicas are away; their messages wait in order', stuck, every, sample);
        RETURN NEXT;
    END IF;
    SELECT count(DISTINCT o.replica) INTO stuck FROM sync.outbox o
    WHERE o.sent_at < now() - every;
    IF stuck > 0 THEN
        level := 'LOG';
        line := format('%s replicas have not confirmed messages sent more than %s ago: wait, they '
                       'confirm in their next upload', stuck, every);
        RETURN NEXT;
    END IF;
    -- Kept uploads that may be filed as they are (next_try_at set: a row they reference has not
    -- come, a duplicate may go, a limit may be raised) wait, backed off; only what a change must
    -- cure asks for a fix.
    RETURN QUERY
    SELECT a.* FROM (
        SELECT CASE WHEN waits_for_data THEN 'LOG' ELSE 'WARNING' END AS severity,
               CASE WHEN waits_for_data
                    THEN format('set aside: %s uploads that wait (the first because %s): they may '
                                'be filed as they are once what they need comes, a row they '
                                'reference or a limit raised; tried again backed off', count(*),
                                min(reason))
                    ELSE format('set aside: %s %s (the first because %s): deploy a fix (a bug); '
                                'they are tried again %s', count(*),
                                CASE kind WHEN 'note' THEN 'changes that could not be planned'
                                          WHEN 'row' THEN 'rows that could not be sent'
                                          WHEN 'upload' THEN 'uploads that could not be filed'
                                          ELSE 'rows their replica could not take' END,
                                min(reason),
                                CASE kind WHEN 'upload' THEN 'once the fix is deployed'
                                          ELSE 'every magic_sync.retry_every' END) END AS detail,
               kind, waits_for_data
        FROM (SELECT s.kind, s.reason, s.kind = 'upload' AND s.next_try_at IS NOT NULL AS waits_for_data
              FROM sync.set_aside s) kept
        GROUP BY kind, waits_for_data) x
    CROSS JOIN LATERAL sync_internal.alarm('set_aside', x.severity, x.detail) a
    ORDER BY x.kind, x.waits_for_data;
END
$$;

-- When the relay must look again though nothing woke it (docs/DESIGN.md §4, an idle relay). A
-- commit that gives the pass work wakes it: notes (the capture, a declaration, DDL), a sender's
-- report (sync.sent), an upload's confirmations, answers and holdings (sync.receive), a change of
-- what filing depends on. What comes with time does not: `pass_at`, when a pass is due for it
-- (now when its work waits already), at the latest `longest` from now:
-- - a confirmation kept because a lease held its message: when the lease ends (now when its
--   session died);
-- - a replicas view read again every magic_sync.replica_scan;
-- - an alarm: a replica refused max_refusals times (now), or a message unconfirmed past
--   unconfirmed_after (when it will be);
-- - a repair held back by its breaker (storm_until); queued work a wake-up was missed for (now).
-- `look_at`: when kept uploads are due for a retry (their backoff ending, or, for those a write to
-- a table they reference may cure, within 2 s: sync_internal.kept_uploads_due polls for it).
CREATE FUNCTION sync_internal.next_due(replica_scan interval, unconfirmed interval, max_refusals int,
                                       longest interval, OUT pass_at timestamptz,
                                       OUT look_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
-- Without JIT, as sync.pass: estimates from a long queue of confirmations had it compile its
-- look (30 ms) at every pass, where running it costs 2.
SET jit = off
AS $$
    SELECT least(
        CASE WHEN EXISTS (SELECT FROM sync.note) OR EXISTS (SELECT FROM sync.answer)
                  OR EXISTS (SELECT FROM sync.foreign_holding)
                  OR EXISTS (SELECT FROM sync.drifted_scope)
                  OR EXISTS (SELECT FROM sync.dropped_codec)
                  OR EXISTS (SELECT FROM sync.replica r
                             WHERE r.reset_pending OR cardinality(r.pending_drops) > 0
                                OR cardinality(r.pending_table_drops) > 0)
                  OR EXISTS (SELECT FROM sync.current_delivery d
                             JOIN sync.replica r ON r.id = d.replica AND r.live
                             WHERE d.refusals >= max_refusals)
             THEN now() END,
        -- Each confirmation's messages found by key (OFFSET 0): sync.confirmation is a queue the
        -- passes empty, and its statistics, taken when it was long, had the plan hash the whole
        -- outbox at every pass (12 ms at 10,000 replicas, for 150 confirmations).
        (SELECT min(CASE WHEN confirmed.lease_holds THEN confirmed.lease_until ELSE now() END)
         FROM sync.confirmation c
         CROSS JOIN LATERAL (SELECT o.lease_until, sync_internal.lease_holds(o) AS lease_holds
                             FROM sync.outbox o WHERE o.replica = c.replica AND o.seq <= c.applied
                             OFFSET 0) confirmed),
        (SELECT st.replicas_scanned_at + replica_scan
         FROM sync.replica_set s JOIN pg_class v ON v.oid = s.relation AND v.relkind NOT IN ('r', 'p')
         CROSS JOIN sync.relay_state st),
        (SELECT o.sent_at + unconfirmed FROM sync.outbox o JOIN sync.replica r
         ON r.id = o.replica AND r.live WHERE o.sent_at IS NOT NULL ORDER BY o.sent_at LIMIT 1),
        (SELECT min(p.storm_until) FROM sync.repair p WHERE p.storm_until > now()),
        now() + longest),
        least((SELECT min(s.next_try_at) FROM sync.set_aside s WHERE s.kind = 'upload'),
              (SELECT now() + interval '2 seconds' FROM sync.set_aside s
               WHERE s.kind = 'upload' AND s.next_try_at > now() AND s.data_seen IS NOT NULL
               LIMIT 1))
$$;

-- Alarms: a replica that left what it was sent unconfirmed longer than
-- magic_sync.unconfirmed_after, or whose head message was refused magic_sync.max_refusals times,
-- is dropped and provisioned again by the next pass. Returns one line per replica, and why, each
-- raised as an alarm (sync_internal.alarm).
CREATE FUNCTION sync_internal.alarms() RETURNS TABLE (replica uuid, line text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    unconfirmed interval := sync.setting('unconfirmed_after')::interval;
    max_refusals int := sync.setting('max_refusals')::int;
    alarmed uuid[];
    reasons text[];
BEGIN
    PERFORM sync_internal.relay_lock();
    SELECT array_agg(r.id),
           array_agg(CASE WHEN d.refusals >= max_refusals
                          THEN format('its messages were refused %s times (last: %s)', d.refusals, d.last_error)
                          ELSE format('it left messages unconfirmed for more than %s', unconfirmed) END)
    INTO alarmed, reasons
    -- From the replicas that may be alarmed (refused, or with a message sent before the bound,
    -- found through outbox_sent), not from every replica: this runs at every pass.
    FROM (SELECT d.replica FROM sync.delivery d WHERE d.refusals >= max_refusals
          UNION
          SELECT o.replica FROM sync.outbox o WHERE o.sent_at < now() - unconfirmed) may
    JOIN sync.replica r ON r.id = may.replica
    LEFT JOIN sync.current_delivery d ON d.replica = r.id
    WHERE r.live AND (d.refusals >= max_refusals
                      OR EXISTS (SELECT FROM sync.outbox o WHERE o.replica = r.id
                                 AND o.sent_at < now() - unconfirmed));
    IF alarmed IS NULL THEN
        RETURN;
    END IF;
    UPDATE sync.replica r SET live = false WHERE r.id = ANY (alarmed);
    PERFORM sync_internal.end_generation(alarmed);
    INSERT INTO sync.note (codec, key) SELECT 0, jsonb_build_object('id', a) FROM unnest(alarmed) a;
    RETURN QUERY
    SELECT x.id, a.line
    FROM unnest(alarmed, reasons) AS x(id, why)
    CROSS JOIN LATERAL sync_internal.alarm('provisioned_again', 'WARNING',
                                           format('replica %s is provisioned again: %s', x.id, x.why),
                                           x.id) a;
END
$$;
