-- Knowing what a replica holds (DESIGN §7): drift found by fingerprint, repaired by range -------
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
CREATE FUNCTION sync.scope_fingerprint(scope bigint, OUT fp bytea, OUT n bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT sync.fp_sum(sha256(r.k || r.hash)), count(*)
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
    SELECT sync.scope_name(s.match, s.value, s.partition), encode(e.fp, 'hex'), encode(s.fp, 'hex'),
           e.n, s.n, e.fp = s.fp AND e.n = s.n
    FROM sync.member m
    JOIN sync.scope s ON s.id = m.scope
    CROSS JOIN LATERAL sync.scope_fingerprint(s.id) e
    WHERE m.replica = verify.replica
    ORDER BY 1
$$;

-- The breaker tripped: said once per trip, with the scope and the tables it holds rows of.
CREATE FUNCTION sync.repair_storm(replica uuid, scope bigint, rounds int, attempts int,
                                  backoff interval) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    name text;
    tables text;
BEGIN
    SELECT sync.scope_name(s.match, s.value, s.partition) INTO name
    FROM sync.scope s WHERE s.id = repair_storm.scope;
    SELECT string_agg(t, ', ' ORDER BY t) INTO tables
    FROM (SELECT DISTINCT c.table_name AS t FROM sync.row r JOIN sync.codec c ON c.id = r.codec
          WHERE r.scope = repair_storm.scope) x;
    RAISE LOG 'magic_sync: repair storm: replica % scope "%" (tables %) did not converge after % repair rounds; nothing more is sent to repair it for % (attempt %)',
              repair_storm.replica, name, coalesce(tables, 'none'), rounds, backoff, attempts;
END
$$;

-- sync.status (one row per replica) compares with the declarations too: in src/verify/truth.sql.
