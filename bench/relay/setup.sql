-- bench/relay: the template every measured database is made from (psql, ON_ERROR_STOP).
-- One catalog table (to every live replica), the replicas table, a copy target of the catalog
-- table's shape, and the procedures that run and time passes, one transaction per pass as the
-- relay worker runs them.
CREATE EXTENSION magic_sync;
CREATE SCHEMA bench;
CREATE TABLE bench.registers (id uuid PRIMARY KEY, active boolean NOT NULL DEFAULT true);
CREATE TABLE bench.items (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL,
                          price numeric(10, 2), updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench.copy (LIKE bench.items INCLUDING ALL);
SELECT sync.replicas('bench.registers', 'registers', live => 'active') \gset
SELECT sync.catalog('bench.items') \gset

-- What was measured: one row per timed run.
CREATE TABLE bench.timing (label text NOT NULL, n bigint NOT NULL, passes int NOT NULL,
                           ms float8 NOT NULL, notes bigint NOT NULL, messages bigint NOT NULL,
                           quiet_ms float8, at timestamptz NOT NULL DEFAULT clock_timestamp());
-- Every timed pass.
CREATE TABLE bench.pass_log (label text NOT NULL, n bigint NOT NULL, pass int NOT NULL,
                             ms float8 NOT NULL, notes bigint NOT NULL, messages bigint NOT NULL);

-- What a sender and the replicas would do: every unsent message taken, applied, confirmed.
CREATE PROCEDURE bench.deliver() LANGUAGE sql AS $$
    UPDATE sync.outbox SET sent_at = now() WHERE sent_at IS NULL;
    INSERT INTO sync.confirmation (replica, applied)
        SELECT replica, max(seq) FROM sync.outbox GROUP BY replica;
$$;

-- Runs passes, each in its own transaction (the time of a pass includes its commit), until a
-- pass takes no note and writes no message (that quiet pass is timed apart, as quiet_ms).
-- With deliver, every message is delivered (untimed) after each pass, as if a sender kept up.
-- With most, it stops after that many passes.
CREATE PROCEDURE bench.run_passes(label text, n bigint, deliver boolean, most int DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    elapsed float8;
    total float8 := 0;
    passes int := 0;
    notes bigint := 0;
    messages bigint := 0;
    r record;
BEGIN
    LOOP
        t0 := clock_timestamp();
        SELECT * INTO r FROM sync.pass();
        COMMIT;
        elapsed := extract(epoch FROM clock_timestamp() - t0) * 1000;
        EXIT WHEN r.notes = 0 AND r.messages = 0;
        total := total + elapsed;
        passes := passes + 1;
        notes := notes + r.notes;
        messages := messages + r.messages;
        INSERT INTO bench.pass_log VALUES (label, n, passes, elapsed, r.notes, r.messages);
        IF passes = most THEN
            elapsed := NULL;
            EXIT;
        END IF;
        IF deliver THEN
            CALL bench.deliver();
            COMMIT;
        END IF;
    END LOOP;
    INSERT INTO bench.timing (label, n, passes, ms, notes, messages, quiet_ms)
        VALUES (label, n, passes, total, notes, messages, elapsed);
    COMMIT;
END
$$;

-- The floor: a plain INSERT ... SELECT copy of the catalog table's rows, with its commit.
CREATE PROCEDURE bench.time_copy(label text) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    copied bigint;
BEGIN
    INSERT INTO bench.copy SELECT * FROM bench.items;
    GET DIAGNOSTICS copied = ROW_COUNT;
    COMMIT;
    INSERT INTO bench.timing (label, n, passes, ms, notes, messages)
        VALUES (label, copied, 0, extract(epoch FROM clock_timestamp() - t0) * 1000, 0, 0);
    COMMIT;
END
$$;

-- What the peers start from (Electric, PowerSync): PostgreSQL's logical decoding. wal2json reads
-- the same changes from a slot made before they were written (issue 25), timed with its reading
-- of every one of them (format-version 2: one JSON document per changed row).
CREATE PROCEDURE bench.time_decode(label text, slot name) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    decoded bigint;
BEGIN
    SELECT count(*) INTO decoded
    FROM pg_logical_slot_get_changes(slot, NULL, NULL, 'format-version', '2');
    INSERT INTO bench.timing (label, n, passes, ms, notes, messages)
        VALUES (label, decoded, 0, extract(epoch FROM clock_timestamp() - t0) * 1000, 0, 0);
END
$$;

-- The floor docs/DESIGN.md §3 and §4 set under any pass, each step a bare set statement over the same
-- rows, timed with its commit: encoding the rows (sync_internal.encode_row over a table scan, no joins),
-- writing their state once into a table of the row shape docs/DESIGN.md §3 names (codec, key, scope,
-- seq, hash, gone, with the key hash `k` that stands for (codec, key) as the key), indexed as a
-- pass must read it, by key and by (scope, seq), and taking their notes (a plain DELETE of all).
-- Run after the passes: the state copied is the passes' own, the notes are one UPDATE's.
CREATE TABLE bench.state (codec int NOT NULL, key jsonb NOT NULL, k bytea NOT NULL,
                          scope bigint NOT NULL, seq bigint NOT NULL, hash bytea,
                          gone boolean NOT NULL DEFAULT false, PRIMARY KEY (k, scope));
CREATE INDEX state_scope_seq ON bench.state (scope, seq);

CREATE PROCEDURE bench.time_floor(label text) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    n bigint;
BEGIN
    t0 := clock_timestamp();
    SELECT count(sync_internal.encode_row(t, '{}')) INTO n FROM bench.items t;
    INSERT INTO bench.timing (label, n, passes, ms, notes, messages)
        VALUES (label || '.encode', n, 0, extract(epoch FROM clock_timestamp() - t0) * 1000, 0, 0);
    COMMIT;
    t0 := clock_timestamp();
    INSERT INTO bench.state SELECT codec, key, k, scope, seq, hash, gone FROM sync.row;
    GET DIAGNOSTICS n = ROW_COUNT;
    COMMIT;
    INSERT INTO bench.timing (label, n, passes, ms, notes, messages)
        VALUES (label || '.state', n, 0, extract(epoch FROM clock_timestamp() - t0) * 1000, 0, 0);
    COMMIT;
    UPDATE bench.items SET qty = qty + 1;
    COMMIT;
    t0 := clock_timestamp();
    DELETE FROM sync.note;
    GET DIAGNOSTICS n = ROW_COUNT;
    COMMIT;
    INSERT INTO bench.timing (label, n, passes, ms, notes, messages)
        VALUES (label || '.notes', n, 0, extract(epoch FROM clock_timestamp() - t0) * 1000, n, 0);
    COMMIT;
END
$$;
