-- Knowing what a replica holds (docs/DESIGN.md §7): drift found by fingerprint, repaired by range -------
--
-- Each replica reports per scope what it holds (sync.holding, written by sync.receive). The pass
-- (repair.cpp) compares a report made at the scope's head with the scope's running
-- fingerprint; on a difference it asks the fingerprints of 16 ranges of the key hash k, resends
-- whole the mismatched ranges of at most magic_sync.leaf_rows rows (range-replace), splits the
-- larger ones again, and checks once more. One row here per (replica, scope) being repaired.

CREATE TABLE sync.repair (
    replica uuid NOT NULL REFERENCES sync.replica ON DELETE CASCADE,
    scope bigint NOT NULL REFERENCES sync.scope ON DELETE CASCADE,
    gen int NOT NULL,           -- the replica's generation when it started
    head bigint NOT NULL,       -- the scope's head it repairs against; moved: started over
    -- idle: wait for a report at the head; asking: the fingerprints of `ranges` were asked in
    -- message `waiting`; checking: repairs were sent up to message `waiting`, then compare again.
    phase text NOT NULL DEFAULT 'idle' CHECK (phase IN ('idle', 'asking', 'checking')),
    level int NOT NULL DEFAULT 0,          -- hex digits of the asked ranges' common prefix
    ranges text[] NOT NULL DEFAULT '{}',   -- the asked ranges, as hex prefixes of k
    waiting bigint,                        -- seq of the last message sent for it
    rounds int NOT NULL DEFAULT 0,         -- rounds (batches of messages) since first_round_at
    first_round_at timestamptz,
    storm_until timestamptz,               -- the breaker tripped: nothing sent before then
    attempts int NOT NULL DEFAULT 0,       -- times the breaker tripped without converging
    ranges_asked bigint NOT NULL DEFAULT 0,
    rows_sent bigint NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (replica, scope)
);

-- What the server's rows of a scope fingerprint to, from scratch: Σ SHA-256(k ‖ v), count.
CREATE FUNCTION sync_internal.scope_fingerprint(scope bigint, OUT fp bytea, OUT n bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sync_internal.fp_sum(sha256(r.k || r.hash)), count(*)
    FROM sync.row r WHERE r.scope = scope_fingerprint.scope AND NOT r.gone AND NOT r.withheld
$$;

-- A self-check: for each scope the replica is a member of, its fingerprint recomputed from
-- sync.row against the running one the pass keeps in sync.scope.
CREATE FUNCTION sync.verify(replica uuid)
RETURNS TABLE (scope text, expected_fp text, running_fp text, expected_n bigint, running_n bigint,
               ok boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sync_internal.scope_name(s.match, s.value, s.partition), encode(e.fp, 'hex'), encode(s.fp, 'hex'),
           e.n, s.n, e.fp = s.fp AND e.n = s.n
    FROM sync.member m
    JOIN sync.scope s ON s.id = m.scope
    CROSS JOIN LATERAL sync_internal.scope_fingerprint(s.id) e
    WHERE m.replica = verify.replica
    ORDER BY 1
$$;

-- The breaker tripped: said once per trip, with the scope and the tables it holds rows of, in the
-- log and as the alarm repair_storm (sync_internal.alarm: a NOTIFY for an operator's pager). A
-- storm means a bug to fix (a row the device cannot take), so it is alarmed like a refusal.
CREATE FUNCTION sync_internal.repair_storm(replica uuid, scope bigint, rounds int, attempts int,
                                  backoff interval) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    name text;
    tables text;
    said text;
BEGIN
    SELECT sync_internal.scope_name(s.match, s.value, s.partition) INTO name
    FROM sync.scope s WHERE s.id = repair_storm.scope;
    SELECT string_agg(t, ', ' ORDER BY t) INTO tables
    FROM (SELECT DISTINCT c.table_name AS t FROM sync.row r JOIN sync.codec c ON c.id = r.codec
          WHERE r.scope = repair_storm.scope) x;
    SELECT a.line INTO said
    FROM sync_internal.alarm('repair_storm', 'LOG', format(
        'repair storm: replica %s scope "%s" (tables %s) did not converge after %s repair rounds; '
        'nothing more is sent to repair it for %s (attempt %s)',
        repair_storm.replica, name, coalesce(tables, 'none'), rounds, backoff, attempts),
        repair_storm.replica) a;
    RAISE LOG 'magic_sync relay: %', said;
END
$$;

-- sync.status (one row per replica) compares with the declarations too: in src/verify/truth.sql.

-- The steps of a repair (src/verify/repair.cpp works out the ranges and encodes the messages) ------

-- Repairs that can move no more are ended: the replica left, was provisioned again, or left the
-- scope; the scope moved on, so what was asked is moot (a tripped breaker is remembered, so changes
-- to the scope do not hide a storm: it waits for a report at the new head); or it converged (the
-- replica reports the server's fingerprint at the head).
CREATE FUNCTION sync_internal.repair_end_moot() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Every pass asks; nearly always there is no repair, and the joins below cost a pass 23 ms at
    -- 10,000 replicas even then.
    IF NOT EXISTS (SELECT FROM sync.repair) THEN
        RETURN;
    END IF;
    DELETE FROM sync.repair p
    WHERE NOT EXISTS (SELECT FROM sync.replica r WHERE r.id = p.replica AND r.live AND r.gen = p.gen)
       OR NOT EXISTS (SELECT FROM sync.member m WHERE m.replica = p.replica AND m.scope = p.scope);
    DELETE FROM sync.repair p USING sync.scope s
    WHERE s.id = p.scope AND s.head <> p.head AND p.attempts = 0;
    UPDATE sync.repair p SET head = s.head, phase = 'idle', level = 0, ranges = '{}', waiting = NULL
    FROM sync.scope s WHERE s.id = p.scope AND s.head <> p.head;
    DELETE FROM sync.repair p USING sync.member m, sync.scope s, sync.holding h
    WHERE m.replica = p.replica AND m.scope = p.scope AND s.id = p.scope
      AND h.replica = p.replica AND h.scope = sync_internal.scope_name(s.match, s.value, s.partition)
      AND m.sent = s.head AND m.confirmed >= s.head AND h.through = s.head
      AND h.fp = s.fp AND h.n = s.n
      AND (p.waiting IS NULL OR NOT EXISTS (SELECT FROM sync.outbox o
                                             WHERE o.replica = p.replica AND o.seq = p.waiting));
END
$$;

-- Whether a replica's report matches its scope: at the head with its fingerprint and count, or
-- behind the head (a scope's head only moves on, so a report behind it can never be at it: the
-- replica reports again once it holds what it was sent). No repair begins from a settled report
-- (sync.holding.settled), whatever its replica's cursors say when the pass looks.
CREATE FUNCTION sync_internal.report_settled(through bigint, fp bytea, n bigint, scope sync.scope)
RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN through < scope.head OR (through = scope.head AND fp = scope.fp AND n = scope.n);

-- What can move: a report at the head that differs with no repair yet (`phase` NULL), or a repair
-- whose last message the replica confirmed and whose breaker is not holding it back, with the
-- ranges it asked (`asked`, hex prefixes) and the replica's answers (`answers`,
-- its holding's ranges). Reports of replicas that are not live or of scopes they are not members
-- of never join. Only the reports not settled and those of repairs under way are looked at: every
-- pass asks, and comparing every replica's reports with their scopes cost 21 ms a pass at 10,000
-- replicas when all of them matched.
CREATE FUNCTION sync_internal.repair_targets()
RETURNS TABLE (replica uuid, scope bigint, scope_name text, gen int, phase text, asked text[],
               answers text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT looked.replica, at.scope, looked.scope_name, at.gen, p.phase, p.ranges, at.answers
    FROM (SELECT u.replica, u.scope AS scope_name FROM sync.holding u WHERE NOT u.settled
          UNION
          SELECT w.replica, sync_internal.scope_name(ws.match, ws.value, ws.partition)
          FROM sync.repair w JOIN sync.scope ws ON ws.id = w.scope) looked
    -- Each report's cursor, scope and replica found by key (OFFSET 0: not joins that the plan
    -- may make by hashing every replica's cursor when it guesses many reports looked at).
    CROSS JOIN LATERAL (
        SELECT m.scope, r.gen, h.ranges::text AS answers, h.fp <> s.fp OR h.n <> s.n AS differs
        FROM sync.holding h
        JOIN sync.member m ON m.replica = h.replica
        JOIN sync.scope s ON s.id = m.scope
         AND sync_internal.scope_name(s.match, s.value, s.partition) = h.scope
        JOIN sync.replica r ON r.id = h.replica AND r.live
        WHERE h.replica = looked.replica AND h.scope = looked.scope_name
          AND m.sent = s.head AND m.confirmed >= s.head AND h.through = s.head
        OFFSET 0) at
    LEFT JOIN sync.repair p ON p.replica = looked.replica AND p.scope = at.scope
    WHERE CASE WHEN p.replica IS NULL THEN at.differs
          ELSE (p.storm_until IS NULL OR p.storm_until <= now())
               AND (p.waiting IS NULL OR NOT EXISTS (SELECT FROM sync.outbox o
                    WHERE o.replica = p.replica AND o.seq = p.waiting)) END
    ORDER BY looked.replica, at.scope;
END
$$;

-- A repair begins for a report that differs, against the scope's head.
CREATE FUNCTION sync_internal.repair_begin(replica uuid, scope bigint, gen int) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO sync.repair (replica, scope, gen, head)
    SELECT repair_begin.replica, s.id, repair_begin.gen, s.head
    FROM sync.scope s WHERE s.id = repair_begin.scope;
END
$$;

-- Counts a round (a batch of messages) for the repair; false when it is one too many: more than 8
-- within magic_sync.storm_window trip the breaker instead, which holds the repair back for 30 s ×
-- the times it tripped without converging, and says so (sync_internal.repair_storm).
CREATE FUNCTION sync_internal.repair_count_round(replica uuid, scope bigint, storm_window_ms int)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    storm_rounds CONSTANT int := 8;
    storm_backoff_s CONSTANT int := 30;
    counted record;
BEGIN
    UPDATE sync.repair p SET
        rounds = CASE WHEN p.first_round_at IS NULL
                           OR p.first_round_at < now() - make_interval(secs => storm_window_ms / 1000.0)
                      THEN 1 ELSE p.rounds + 1 END,
        first_round_at = CASE WHEN p.first_round_at IS NULL
                                   OR p.first_round_at < now() - make_interval(secs => storm_window_ms / 1000.0)
                              THEN now() ELSE p.first_round_at END
    WHERE p.replica = repair_count_round.replica AND p.scope = repair_count_round.scope
    RETURNING p.rounds, p.attempts + 1 AS attempts INTO counted;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF counted.rounds <= storm_rounds THEN
        RETURN true;
    END IF;
    UPDATE sync.repair p SET phase = 'idle', ranges = '{}', level = 0, waiting = NULL, rounds = 0,
        first_round_at = NULL, attempts = counted.attempts,
        storm_until = now() + make_interval(secs => storm_backoff_s * counted.attempts)
    WHERE p.replica = repair_count_round.replica AND p.scope = repair_count_round.scope;
    PERFORM sync_internal.repair_storm(repair_count_round.replica, repair_count_round.scope,
                              counted.rounds - 1, counted.attempts,
                              make_interval(secs => storm_backoff_s * counted.attempts));
    RETURN false;
END
$$;

-- Puts an unnumbered repair or ranges message in the replica's outbox (sync_internal.enqueue numbers and
-- stamps it). Returns its seq.
CREATE FUNCTION sync_internal.repair_put(replica uuid, kind text, body bytea) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO pg_temp.magic_sync_enqueue (replica, position, kind, body)
    VALUES (repair_put.replica, 1, repair_put.kind, repair_put.body);
    PERFORM sync_internal.enqueue();
    RETURN (SELECT r.next_seq - 1 FROM sync.replica r WHERE r.id = repair_put.replica);
END
$$;

-- The messages of a round were sent: the repair's phase (asking: the fingerprints of `ranges`, of
-- `level` hex digits, were asked; checking: repairs were sent), the seq of its last message, and
-- what it asked and sent.
CREATE FUNCTION sync_internal.repair_sent(replica uuid, scope bigint, phase text, level int, ranges text[],
                                 waiting bigint, ranges_asked int, rows_sent bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE sync.repair p SET phase = repair_sent.phase, level = repair_sent.level,
        ranges = repair_sent.ranges, waiting = repair_sent.waiting,
        ranges_asked = p.ranges_asked + repair_sent.ranges_asked,
        rows_sent = p.rows_sent + repair_sent.rows_sent
    WHERE p.replica = repair_sent.replica AND p.scope = repair_sent.scope;
END
$$;

-- Every range asked matched, yet the whole did not: the whole is compared again.
CREATE FUNCTION sync_internal.repair_check_again(replica uuid, scope bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE sync.repair p SET phase = 'checking', ranges = '{}', waiting = NULL
    WHERE p.replica = repair_check_again.replica AND p.scope = repair_check_again.scope;
END
$$;

-- The replica's answers to the ranges asked (its holding's `ranges`): [lo, hi, fp, n] each.
CREATE FUNCTION sync_internal.repair_answers(answers jsonb)
RETURNS TABLE (lo text, hi text, fp text, n bigint)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e->>0, e->>1, e->>2, (e->>3)::bigint
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(answers) = 'array' THEN answers
                                   ELSE '[]' END) e
    WHERE jsonb_typeof(e) = 'array'
$$;

-- The server's fingerprints of the ranges `prefixes` (of `level` hex digits) of a scope: one scan
-- of its rows. The ranges are matched by a hashed IN, not = ANY: a kept plan is generic, and
-- = ANY of a parameter compares each row with every range (4,096 ranges of 100,000 rows took
-- 50 s).
CREATE FUNCTION sync_internal.repair_fingerprints(scope bigint, level int, prefixes text[])
RETURNS TABLE (prefix text, fp text, n bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT left(encode(r.k, 'hex'), repair_fingerprints.level),
           encode(sync_internal.fp_sum(sha256(r.k || r.hash)), 'hex'), count(*)
    FROM sync.row r
    WHERE r.scope = repair_fingerprints.scope AND NOT r.gone AND NOT r.withheld
      AND left(encode(r.k, 'hex'), repair_fingerprints.level)
          IN (SELECT unnest(repair_fingerprints.prefixes))
    GROUP BY 1;
END
$$;

-- The server's rows of the ranges `prefixes` (of `level` hex digits) of a scope, by k, as a
-- repair message carries them.
CREATE FUNCTION sync_internal.repair_rows(scope bigint, level int, prefixes text[])
RETURNS TABLE (prefix text, k text, table_name text, key text, body text, hash bytea)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT left(encode(r.k, 'hex'), repair_rows.level), encode(r.k, 'hex'), c.table_name,
           sync_internal.canonical(r.key), r.body, r.hash
    FROM sync.row r JOIN sync.codec c ON c.id = r.codec
    WHERE r.scope = repair_rows.scope AND NOT r.gone AND NOT r.withheld
      AND left(encode(r.k, 'hex'), repair_rows.level) IN (SELECT unnest(repair_rows.prefixes))
    ORDER BY r.k;
END
$$;
