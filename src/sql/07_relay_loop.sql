-- The relay loop (DESIGN §4): the worker and CALL sync.relay() run passes and, on their timers,
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

-- The relay runs as soon as the current transaction commits.
CREATE FUNCTION sync.wake() RETURNS void
AS 'MODULE_PATHNAME', 'magic_sync_wake'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

-- Tries again what was set aside: notes are planned again; rows withheld as too big, or that a
-- replica could not take, are sent again (a new seq in their scope, their content unchanged),
-- so a deploy that fixed the cause lets them through. Returns what it did, as log lines.
CREATE FUNCTION sync.retry_set_aside() RETURNS TABLE (level text, line text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    notes bigint;
    rows_again bigint;
    kept record;
    refiled bigint := 0;
    still_kept bigint := 0;
    outcome text;
    relay_role text;
    last_kept bigint;
    last_echo bigint;
BEGIN
    PERFORM sync.relay_lock();
    INSERT INTO sync.note (codec, key) SELECT s.codec, s.key FROM sync.set_aside s WHERE s.kind = 'note';
    GET DIAGNOSTICS notes = ROW_COUNT;
    WITH again AS (
        DELETE FROM sync.set_aside s WHERE s.kind IN ('row', 'untaken') RETURNING s.codec, s.key),
    bumped AS (
        UPDATE sync.row r SET seq = nextval('sync.row_seq')
        FROM (SELECT DISTINCT sync.key_hash(c.table_name, a.key) AS k
              FROM again a JOIN sync.codec c ON c.id = a.codec) a
        WHERE r.k = a.k AND NOT r.gone
        RETURNING r.scope, r.seq)
    UPDATE sync.scope s SET head = greatest(s.head, b.seq)
    FROM (SELECT scope, max(seq) AS seq FROM bumped GROUP BY scope) b
    WHERE s.id = b.scope;
    GET DIAGNOSTICS rows_again = ROW_COUNT;
    IF notes + rows_again > 0 THEN
        level := 'LOG';
        line := format('retrying what was set aside: %s notes planned again, rows sent again in %s scopes',
                       notes, rows_again);
        RETURN NEXT;
    END IF;

    -- Uploads kept because they could not be filed are filed again: a kept row as a new upload of
    -- that one row, a kept message as it came. What fails again is kept again, its tries counted.
    -- They are filed as the role that sent them (sync.set_aside.filed_as), never as the relay's
    -- own: a row that the route's privileges or row policies refused stays refused.
    FOR kept IN
        DELETE FROM sync.set_aside s WHERE s.kind = 'upload' AND s.replica IS NOT NULL
        RETURNING s.*
    LOOP
        IF kept.filed_as IS NOT NULL AND (to_regrole(kept.filed_as) IS NULL OR NOT has_function_privilege(
                kept.filed_as, 'sync.receive(uuid, bytea)', 'EXECUTE')) THEN
            outcome := 'dropped';  -- that role cannot file any more
        ELSE
            last_kept := (SELECT coalesce(max(s.id), 0) FROM sync.set_aside s);
            last_echo := (SELECT coalesce(max(e.id), 0) FROM sync.echo e);
            IF kept.codec IS NULL THEN
                -- A message kept whole was recorded under its id, when that could be read, with
                -- the answer "kept whole": forgotten here, or it would only be answered again.
                DELETE FROM sync.upload u
                WHERE u.replica = kept.replica AND jsonb_array_length(u.kept) = 1 AND u.kept->0->>'t' = ''
                  AND u.id = (regexp_match(encode(substring(kept.body FROM 1 FOR 256), 'escape'),
                                           '^\s*\{\s*(?:"v"\s*:\s*[0-9]+\s*,\s*)?"id"\s*:\s*"'
                                           '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"'))[1]::uuid;
            END IF;
            IF kept.filed_as IS NOT NULL THEN
                relay_role := current_setting('role');
                PERFORM set_config('role', kept.filed_as, true);
            END IF;
            outcome := sync.receive(kept.replica,
                CASE WHEN kept.codec IS NULL THEN kept.body
                     -- A kept row's body is the row as uploaded: {"t": table, "r": row}.
                     ELSE convert_to(jsonb_build_object('v', 1, 'id', gen_random_uuid(), 'rows',
                              jsonb_build_array(convert_from(kept.body, 'UTF8')::jsonb))::text,
                                     'UTF8') END);
            IF kept.filed_as IS NOT NULL THEN
                PERFORM set_config('role', relay_role, true);
                -- What it kept again was kept for that role, not for the relay's session.
                UPDATE sync.set_aside s SET filed_as = kept.filed_as
                WHERE s.id > last_kept AND s.kind = 'upload';
            END IF;
            -- The replica does not hold what this filed (its answer names an upload it did not
            -- send, or one answered before): those rows go back to it like any other change.
            DELETE FROM sync.echo e WHERE e.id > last_echo;
        END IF;
        IF outcome = 'dropped' OR (kept.codec IS NULL AND outcome = 'answered again') THEN
            -- Its replica is not known any more, or its role cannot file, or it was answered
            -- again: nothing was filed, so it stays kept.
            INSERT INTO sync.set_aside (kind, replica, codec, key, body, reason, first_at, tries, last_try_at,
                                        filed_as)
            VALUES ('upload', kept.replica, kept.codec, kept.key, kept.body, kept.reason, kept.first_at,
                    kept.tries + 1, now(), kept.filed_as);
            still_kept := still_kept + 1;
            CONTINUE;
        END IF;
        UPDATE sync.set_aside s SET tries = kept.tries + 1, first_at = kept.first_at
        WHERE s.kind = 'upload' AND s.replica = kept.replica AND s.codec IS NOT DISTINCT FROM kept.codec
          AND s.key IS NOT DISTINCT FROM kept.key AND s.first_at = now();
        IF FOUND OR outcome = 'kept' THEN
            still_kept := still_kept + 1;
        ELSE
            refiled := refiled + 1;
        END IF;
    END LOOP;
    IF refiled + still_kept > 0 THEN
        level := 'LOG';
        line := format('retrying kept uploads: %s filed now, %s kept again', refiled, still_kept);
        RETURN NEXT;
    END IF;
END
$$;

-- What needs someone, one line each, saying whether to wait (the network) or deploy a fix (a bug).
CREATE FUNCTION sync.report() RETURNS TABLE (level text, line text)
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
    SELECT count(*), now() - min(noted_at) INTO backlog, oldest FROM sync.note;
    IF oldest > every THEN
        level := 'WARNING';
        line := format('%s changes are waiting to be planned, the oldest for %s: the relay is behind. '
                       'Wait while the backlog shrinks; if it does not, deploy a fix (look for relay '
                       'errors above)', backlog, date_trunc('second', oldest));
        RETURN NEXT;
    END IF;
    SELECT count(*), string_agg(DISTINCT coalesce(r.last_error, 'no error yet'), '; ')
    INTO stuck, sample
    FROM sync.replica r
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
    FOR level, line IN
        SELECT 'WARNING', format('set aside: %s %s (the first because %s): deploy a fix (a bug); '
                                 'they are tried again every magic_sync.retry_every', count(*),
                                 CASE kind WHEN 'note' THEN 'changes that could not be planned'
                                           WHEN 'row' THEN 'rows that could not be sent'
                                           WHEN 'upload' THEN 'uploads that could not be filed'
                                           ELSE 'rows their replica could not take' END,
                                 min(reason))
        FROM sync.set_aside GROUP BY kind ORDER BY kind
    LOOP
        RETURN NEXT;
    END LOOP;
END
$$;

-- Alarms: a replica that left what it was sent unconfirmed longer than
-- magic_sync.unconfirmed_after, or whose head message was refused magic_sync.max_refusals times,
-- is dropped and provisioned again by the next pass. Returns one line per replica, and why.
CREATE FUNCTION sync.alarms() RETURNS TABLE (replica uuid, line text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    unconfirmed interval := sync.setting('unconfirmed_after')::interval;
    max_refusals int := sync.setting('max_refusals')::int;
BEGIN
    PERFORM sync.relay_lock();
    RETURN QUERY
    WITH alarmed AS (
        SELECT r.id,
               CASE WHEN r.refusals >= max_refusals
                    THEN format('its messages were refused %s times (last: %s)', r.refusals, r.last_error)
                    ELSE format('it left messages unconfirmed for more than %s', unconfirmed) END AS why
        FROM sync.replica r
        WHERE r.live AND (r.refusals >= max_refusals
                          OR EXISTS (SELECT FROM sync.outbox o WHERE o.replica = r.id
                                     AND o.sent_at < now() - unconfirmed))),
    forgotten AS (UPDATE sync.replica r SET live = false FROM alarmed a WHERE r.id = a.id),
    members AS (DELETE FROM sync.member m USING alarmed a WHERE m.replica = a.id),
    messages AS (DELETE FROM sync.outbox o USING alarmed a WHERE o.replica = a.id),
    noted AS (INSERT INTO sync.note (codec, key) SELECT 0, jsonb_build_object('id', a.id) FROM alarmed a)
    SELECT a.id, format('replica %s is provisioned again: %s', a.id, a.why) FROM alarmed a;
END
$$;
