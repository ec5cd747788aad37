-- The outboxes: their one writer, and the sender's functions (docs/DESIGN.md §4, §5) ----------------------

-- The history a message is written in, as its header's origin names it: this database's system
-- identifier and timeline (a promoted standby or a point-in-time recovery starts another), and the
-- id its relay state was made with (a restore or a re-created extension makes another). A replica
-- that applied messages of another origin does not trust its counters against this one's.
CREATE FUNCTION sync_internal.origin() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('%s/%s', sync_internal.history(), r.origin) FROM sync.relay_state r
$$;

-- The cluster's part of the origin: its system identifier and its timeline (src/pg/history.cpp).
CREATE FUNCTION sync_internal.history() RETURNS text
AS 'MODULE_PATHNAME', 'magic_sync_history' LANGUAGE C STABLE;

-- What a device is told must outlive a failover. A lease (sync.next, sync.pull_head) commits with
-- synchronous_commit at least `on`, whatever the session's: its commit waits until it is where
-- synchronous_standby_names says, and so does every commit before it, among them those of the
-- messages it leases and of the filings their answers report. The rest of the database may
-- commit locally. Called inside a lease's transaction, it holds until that transaction ends.
CREATE FUNCTION sync_internal.lease_commits_durably() RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.set_config('synchronous_commit', 'on', true)
    WHERE pg_catalog.current_setting('synchronous_commit') IN ('off', 'local')
$$;

-- The one writer of the outboxes and of each replica's next_seq. The relay queues the messages of
-- a step of its pass in its working table pg_temp.magic_sync_enqueue (`position` orders a
-- replica's messages) and calls this: each message of a live replica takes the next seq of its
-- replica in that order (those of a replica not live are dropped), its body is made for that seq
-- (a filed answer encoded from its payload, a ranges or repair message stamped with its header; a
-- rows message is assembled as it is sent, sync.message), and next_seq moves past them; the
-- replicas written are noted for the pass's NOTIFY (pg_temp.magic_sync_written). Returns the
-- number of messages written.
CREATE FUNCTION sync_internal.enqueue() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    written bigint;
BEGIN
    WITH queued AS (DELETE FROM pg_temp.magic_sync_enqueue RETURNING *),
    -- Each message's replica found by key (OFFSET 0): the statistics of the working table may be
    -- those of a pass that queued 50,000 messages, and the plan hashed every replica for the 100
    -- of a pass in a fan-out's round (10,000 replicas: 13 ms a pass).
    numbered AS (
        SELECT q.*, r.gen,
               r.next_seq - 1 + row_number() OVER (PARTITION BY q.replica ORDER BY q.position) AS seq
        FROM queued q
        CROSS JOIN LATERAL (SELECT x.gen, x.next_seq FROM sync.replica x
                            WHERE x.id = q.replica AND x.live OFFSET 0) r),
    stored AS (
        INSERT INTO sync.outbox (replica, seq, gen, kind, chunks, reset, drops, table_drops,
                                 advances, upload, body)
        SELECT n.replica, n.seq, n.gen, n.kind, n.chunks, n.reset, n.drops, n.table_drops,
               n.advances, (n.payload->>'upload')::uuid,
               CASE WHEN n.kind = 'filed' THEN sync_internal.encode_filed(n.replica, n.gen, n.seq, n.payload)
                    WHEN n.body IS NOT NULL THEN sync_internal.stamp_message(n.body, n.replica, n.gen, n.seq)
               END
        FROM numbered n
        RETURNING replica),
    written AS (
        INSERT INTO pg_temp.magic_sync_written (replica) SELECT DISTINCT replica FROM stored
        ON CONFLICT DO NOTHING),
    advanced AS (
        UPDATE sync.replica r SET next_seq = r.next_seq + s.n
        FROM (SELECT replica, count(*) AS n FROM stored GROUP BY replica) s
        WHERE r.id = s.replica)
    SELECT count(*) INTO written FROM stored;
    RETURN written;
END
$$;

-- A lease holder is a session: (pid, start). Whether it still lives, whoever asks (through SQL,
-- another role than the extension's owner sees no start of sessions not its own); true for no
-- session (nobody named: the lease holds by its time alone). Per transaction, PostgreSQL takes
-- one view of the sessions: a session that ends during it lives on for it. In C
-- (src/pg/init.cpp): the pass and sync.next ask it for every outbox row they look at.
CREATE FUNCTION sync_internal.session_lives(pid int, backend_start timestamptz) RETURNS boolean
AS 'MODULE_PATHNAME', 'magic_sync_session_lives' LANGUAGE C STABLE PARALLEL RESTRICTED;

-- The rule of a lease, for whatever reads one (sync.next, the pass's pruning): an unsent message's
-- lease holds until `lease_until` and while the session that took it lives. A sender that dies
-- (kill -9, its host gone once the server notices, its connection lost) leaves no lease behind: its
-- replicas go to the next sender that asks, at once. One that is alive but slow keeps them, until
-- the time runs out (the bound for a sender that hangs with its session open).
-- A body of SQL's standard form, resolved when created, and so inlined where it is used: the
-- session is looked at only for a lease whose time has not run out.
CREATE FUNCTION sync_internal.lease_holds(o sync.outbox) RETURNS boolean
LANGUAGE sql STABLE
RETURN o.sent_at IS NULL AND coalesce(o.lease_until > now(), false)
       AND sync_internal.session_lives(o.lease_pid, o.lease_backend_start);

-- Finds each replica's head message without walking what was sent and is not confirmed yet.
CREATE INDEX outbox_unsent ON sync.outbox (replica, seq) WHERE sent_at IS NULL;
-- The unsent messages oldest first, for a sender's look at every replica (sync.next): it walks
-- them until it has the heads it wants, instead of finding the head of every replica and sorting
-- them (at 10,000 replicas that look cost 27-55 ms and a sender made one per exchange). A
-- replica's messages are written in the order of their seqs, so the first of its messages the
-- walk meets is its head.
CREATE INDEX outbox_unsent_age ON sync.outbox (created_at, replica, seq) WHERE sent_at IS NULL;
-- The messages sent and not confirmed yet, oldest first: the relay looks for the oldest (when a
-- replica leaves one unconfirmed too long, sync_internal.next_due and sync_internal.alarms) at
-- every pass, which read every sent message of the outbox (80,000 in a fan-out to 10,000
-- replicas: 28 ms a pass).
CREATE INDEX outbox_sent ON sync.outbox (sent_at) WHERE sent_at IS NOT NULL;

-- A message's id, as senders send it (header message-id) and the pull transport's devices name it:
-- the replica's generation and the message's seq.
CREATE FUNCTION sync_internal.message_id(gen int, seq bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT gen || '.' || seq $$;

-- Leases the head message (lowest unsent seq) of up to `n` live replicas that are not in backoff
-- (or whose probe is due: sync.failed) and whose head's lease does not hold (sync_internal.lease_holds), oldest first, to this session: the
-- lease holds for `lease` and ends at once with the session. A replica whose head is leased or
-- locked by another sender is skipped, never served its second message: one message at a time per
-- replica, in order.
-- With `run` > 1 the head's lease covers it and up to `run` - 1 of the messages after it, returned
-- with it: the sender sends them one at a time, in order, and records them with sync.sent only
-- once the run has ended (all taken, or one failed, or the lease too close to its end to send
-- another), because recording the head sent ends the lease of the whole run. One row is leased
-- per run, so a long outbox costs one lease per run instead of one per message.
-- `among`, when given, limits the look to those replicas: a sender that has just recorded their
-- messages sent asks only for their next ones. Without it the look is at every replica: it walks
-- the unsent messages oldest first (outbox_unsent_age) a batch at a time and stops once it holds
-- `n` heads, so it costs the heads it takes and the messages it passes over (those that are not
-- their replica's head, whose lease holds, or whose replica may not be sent to now), not a look
-- at every replica's head (which cost 27-55 ms at 10,000 replicas, once per sender exchange).
-- When eight batches pass without n heads (the oldest messages wait for replicas in backoff: a
-- fleet offline), it looks at every replica's head after all.
-- `transport` is the sender's (http, nats, exec): it leases only the replicas that transport
-- delivers (sync.replica.transport), and those any sender delivers.
-- Each message comes as its bytes (`message`), assembled (sync.message) when it is a rows message,
-- unless `by_reference`: then a rows message comes by reference (`message` NULL), its envelope
-- (`gen`, `reset`, `drops`, `table_drops`) and the ids of the shared chunks it is made of, in
-- order (`chunks`), and a message stored whole as its bytes (`reset` to `chunks` NULL). The
-- sender asks for references: it fetches the chunks it does not hold (sync.chunks) and assembles
-- the message as sync.message does, so that a chunk is read once per sender, not once per replica
-- it goes to.
-- plpgsql, so that sync.message (the relay's assembly of a message from its chunks) is resolved
-- when the query is first planned, not when this function is created. Its plans are generic: the
-- planner would otherwise plan it afresh at every call (its estimate of a custom plan is lower),
-- which costs more than all the rest of a call. No plan may choose to read the whole outbox or
-- every replica, whatever the statistics say: the walk is a LIMIT on the one index it follows,
-- and every other step reaches a row through a LATERAL lookup by key.
CREATE FUNCTION sync.next(n int, lease interval, among uuid[], run int, transport text DEFAULT NULL,
                          by_reference boolean DEFAULT false)
RETURNS TABLE (replica uuid, seq bigint, message_id text, message bytea, origin text, gen int,
               reset text[], drops text[], table_drops text[], chunks bigint[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    sent_from CONSTANT text := sync_internal.origin();
    -- The walk's batch: enough entries for n heads when each replica has a window of messages.
    batch CONSTANT int := greatest(n, 1) * 8 + 64;
    chosen_replicas uuid[] := '{}';
    chosen_seqs bigint[] := '{}';
    chosen_at timestamptz[] := '{}';
    walked_replicas uuid[];
    walked_seqs bigint[];
    walked_at timestamptz[];
    batches int := 0;
    everyone boolean := false;
    -- Where the walk goes on from: the last entry of the batch before.
    after_at timestamptz := '-infinity';
    after_replica uuid := '00000000-0000-0000-0000-000000000000';
    after_seq bigint := -1;
BEGIN
    PERFORM sync_internal.relay_guard();
    IF n IS NULL OR n < 1 OR lease IS NULL OR lease <= interval '0' OR run IS NULL OR run < 1 THEN
        RAISE EXCEPTION 'sync.next needs n >= 1, a positive lease and run >= 1 (got n = %, lease = %, run = %)',
            n, lease, run
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM sync_internal.lease_commits_durably();
    IF among IS NULL THEN
        LOOP
            batches := batches + 1;
            SELECT array_agg(w.replica ORDER BY w.created_at, w.replica, w.seq),
                   array_agg(w.seq ORDER BY w.created_at, w.replica, w.seq),
                   array_agg(w.created_at ORDER BY w.created_at, w.replica, w.seq)
            INTO walked_replicas, walked_seqs, walked_at
            FROM (SELECT h.replica, h.seq, h.created_at FROM sync.outbox h
                  WHERE h.sent_at IS NULL
                    AND (h.created_at, h.replica, h.seq) > (after_at, after_replica, after_seq)
                  ORDER BY h.created_at, h.replica, h.seq
                  LIMIT batch) w;
            EXIT WHEN walked_replicas IS NULL;
            -- The batch's first message of each replica, in the walk's order, taken while it is
            -- its replica's head, free, and of a replica that may be sent to now; locked as it is
            -- taken (SKIP LOCKED: a head another sender is leasing is passed over; the conditions
            -- are checked again on the locked row version), until the look holds n.
            WITH taken AS (
                SELECT free.replica, free.seq, w.created_at
                FROM (SELECT * FROM (SELECT DISTINCT ON (w.replica) w.*
                                     FROM unnest(walked_replicas, walked_seqs, walked_at)
                                          WITH ORDINALITY AS w(replica, seq, created_at, position)
                                     ORDER BY w.replica, w.position) firsts
                      ORDER BY firsts.position OFFSET 0) w
                CROSS JOIN LATERAL (
                    SELECT o.replica, o.seq FROM sync.outbox o
                    JOIN sync.replica r ON r.id = o.replica
                    -- sync.current_delivery, through the replica at hand.
                    LEFT JOIN sync.delivery d ON d.replica = r.id AND d.gen = r.gen
                    WHERE o.replica = w.replica AND o.seq = w.seq AND o.sent_at IS NULL
                      AND NOT sync_internal.lease_holds(o)
                      AND NOT EXISTS (SELECT FROM sync.outbox before
                                      WHERE before.replica = o.replica AND before.sent_at IS NULL
                                        AND before.seq < o.seq)
                      AND r.live
                      AND (d.backoff_until IS NULL OR d.backoff_until <= now() OR d.probe_at <= now())
                      AND (r.transport IS NULL OR r.transport = next.transport)
                    FOR UPDATE OF o SKIP LOCKED
                ) free
                LIMIT n - cardinality(chosen_replicas)
            )
            SELECT chosen_replicas || coalesce(array_agg(taken.replica), '{}'),
                   chosen_seqs || coalesce(array_agg(taken.seq), '{}'),
                   chosen_at || coalesce(array_agg(taken.created_at), '{}')
            INTO chosen_replicas, chosen_seqs, chosen_at
            FROM taken;
            EXIT WHEN cardinality(chosen_replicas) >= n OR cardinality(walked_replicas) < batch;
            -- Eight batches passed over and n not found: most of the oldest messages wait for
            -- replicas that may not be sent to now (a fleet offline, in backoff), and walking on
            -- would cost more than the look at every replica's head below.
            IF batches = 8 THEN
                everyone := true;
                EXIT;
            END IF;
            after_at := walked_at[cardinality(walked_at)];
            after_replica := walked_replicas[cardinality(walked_replicas)];
            after_seq := walked_seqs[cardinality(walked_seqs)];
        END LOOP;
    END IF;
    IF among IS NOT NULL OR everyone THEN
        -- The head of each replica named (or of every replica), found by key, oldest first,
        -- locked as above. Those the walk locked are found again: this session holds them.
        WITH heads AS MATERIALIZED (
            SELECT r.id AS replica, head.seq, head.created_at
            -- One array either way: a UNION with every replica's id in it was planned (generic
            -- plan) as a hash of every replica, at every look at a few replicas named.
            FROM (SELECT DISTINCT unnest(CASE WHEN everyone
                                              THEN (SELECT array_agg(e.id) FROM sync.replica e)
                                              ELSE among END) AS id) given
            -- By key, whatever the plan would guess of the array's size (OFFSET 0: not a join
            -- that may hash every replica for a look at a few).
            CROSS JOIN LATERAL (SELECT * FROM sync.replica x WHERE x.id = given.id OFFSET 0) r
            -- sync.current_delivery, through the replica at hand (the view was read whole).
            LEFT JOIN sync.delivery d ON d.replica = r.id AND d.gen = r.gen
            CROSS JOIN LATERAL (
                SELECT h.seq, h.created_at FROM sync.outbox h
                WHERE h.replica = r.id AND h.sent_at IS NULL
                ORDER BY h.seq LIMIT 1
            ) head
            WHERE r.live AND (d.backoff_until IS NULL OR d.backoff_until <= now() OR d.probe_at <= now())
              AND (r.transport IS NULL OR r.transport = next.transport)
        ),
        taken AS (
            SELECT free.replica, free.seq, heads.created_at
            FROM (SELECT * FROM heads ORDER BY heads.created_at, heads.replica) heads
            CROSS JOIN LATERAL (
                SELECT o.replica, o.seq FROM sync.outbox o
                WHERE o.replica = heads.replica AND o.seq = heads.seq AND o.sent_at IS NULL
                  AND NOT sync_internal.lease_holds(o)
                FOR UPDATE SKIP LOCKED
            ) free
            LIMIT n
        )
        SELECT coalesce(array_agg(taken.replica), '{}'), coalesce(array_agg(taken.seq), '{}'),
               coalesce(array_agg(taken.created_at), '{}')
        INTO chosen_replicas, chosen_seqs, chosen_at
        FROM taken;
    END IF;
    RETURN QUERY
    WITH chosen AS (
        SELECT * FROM unnest(chosen_replicas, chosen_seqs, chosen_at) AS c(replica, seq, created_at)
    ),
    leased AS (
        -- Held by this session: it ends with it.
        UPDATE sync.outbox o
        SET lease_until = now() + lease, lease_pid = pg_backend_pid(),
            lease_backend_start = (SELECT a.backend_start
                                   FROM pg_stat_get_activity(pg_backend_pid()) a),
            tries = o.tries + 1
        FROM chosen
        WHERE o.replica = chosen.replica AND o.seq = chosen.seq
    )
    SELECT following.replica, following.seq, sync_internal.message_id(following.gen, following.seq),
           CASE WHEN following.body IS NOT NULL THEN following.body
                WHEN NOT next.by_reference THEN sync.message(following.replica, following.seq) END,
           sent_from, following.gen,
           -- By reference: a rows message that is not stored whole.
           CASE WHEN next.by_reference AND following.body IS NULL THEN following.reset END,
           CASE WHEN next.by_reference AND following.body IS NULL THEN following.drops END,
           CASE WHEN next.by_reference AND following.body IS NULL THEN following.table_drops END,
           CASE WHEN next.by_reference AND following.body IS NULL THEN following.chunks END
    FROM chosen
    CROSS JOIN LATERAL (
        SELECT f.replica, f.seq, f.gen, f.body, f.reset, f.drops, f.table_drops, f.chunks
        FROM sync.outbox f
        WHERE f.replica = chosen.replica AND f.seq >= chosen.seq AND f.sent_at IS NULL
        ORDER BY f.seq LIMIT run
    ) following
    ORDER BY chosen.created_at, following.replica, following.seq;
END
$$;

CREATE FUNCTION sync.next(n int, lease interval)
RETURNS TABLE (replica uuid, seq bigint, message_id text, message bytea, origin text, gen int,
               reset text[], drops text[], table_drops text[], chunks bigint[])
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT * FROM sync.next(n, lease, NULL, 1, NULL) $$;

-- The shared chunks named by `ids` (as sync.next returned them by reference), for a sender that assembles rows
-- messages itself: each one's body and the notes of the rows of its run that were withheld, in
-- order, as parallel arrays: table, key (canonical JSON; NULL where the note names the key by its
-- hash), reason and key hash (64 hex; NULL where it names the key). Only while this database's
-- history is `origin` (as sync.next returned it with the ids): chunk ids start again in a restored
-- or re-created database, and a chunk of another history must never be taken for one of this.
-- A chunk no message names any more is gone (sync.prune): its messages are gone too.
CREATE FUNCTION sync.chunks(ids bigint[], origin text)
RETURNS TABLE (id bigint, body text, withheld_tables text[], withheld_keys text[],
               withheld_whys text[], withheld_key_hashes text[])
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.id, c.body, notes.tables, notes.keys, notes.whys, notes.key_hashes
    FROM sync.chunk c
    CROSS JOIN LATERAL (
        SELECT coalesce(array_agg(w.note->>'t' ORDER BY w.position), '{}') AS tables,
               coalesce(array_agg(sync_internal.canonical(w.note->'k') ORDER BY w.position),
                        '{}') AS keys,
               coalesce(array_agg(w.note->>'why' ORDER BY w.position), '{}') AS whys,
               coalesce(array_agg(w.note->>'kh' ORDER BY w.position), '{}') AS key_hashes
        FROM jsonb_array_elements(c.withheld) WITH ORDINALITY AS w(note, position)
    ) notes
    WHERE c.id = ANY (chunks.ids) AND chunks.origin = sync_internal.origin()
$$;

-- The messages were taken: each is sent (it stays in the outbox until the replica confirms it),
-- its lease ends, its replica's backoff ends. Returns the replicas whose backoff this ended (they
-- recovered), for the sender's log. One statement for a whole batch of deliveries. A generic plan,
-- for the reason sync.next has one: a custom plan for a batch of a thousand deliveries cost more
-- than recording them, and chose to read the whole outbox.
-- It waits for no message (SKIP LOCKED): one that another transaction holds is being deleted by
-- the relay (its replica confirmed it, or its generation ended) or recorded by another sender
-- that took it over when this one's lease ran out; left unsent, it goes again under the same id,
-- which the replica ignores. Waiting there, holding the batch's other messages, is how a sender
-- and a pass that deletes two of them would wait for each other (docs/DESIGN.md §5).
CREATE FUNCTION sync.sent(replicas uuid[], seqs bigint[], origins text[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    here CONSTANT text := sync_internal.origin();  -- once, not per delivery
BEGIN
    PERFORM sync_internal.relay_guard();
    IF cardinality(replicas) IS DISTINCT FROM cardinality(seqs) THEN
        RAISE EXCEPTION 'sync.sent needs as many seqs as replicas (got % and %)',
            cardinality(replicas), cardinality(seqs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A message delivered from another history (`origins`, as sync.next returned them: the
    -- sender reconnected after a restore or a failover) is not the one of that seq here.
    WITH taken AS (
        SELECT o.replica, o.seq
        FROM sync.outbox o
        JOIN unnest(replicas, seqs,
                    coalesce(origins, array_fill(NULL::text, ARRAY[cardinality(replicas)])))
             AS delivered(replica, seq, origin)
          ON o.replica = delivered.replica AND o.seq = delivered.seq
        WHERE o.sent_at IS NULL AND (delivered.origin IS NULL OR delivered.origin = here)
        FOR UPDATE OF o SKIP LOCKED)
    UPDATE sync.outbox o SET sent_at = now(), lease_until = NULL, lease_pid = NULL,
                             lease_backend_start = NULL
    FROM taken
    WHERE o.replica = taken.replica AND o.seq = taken.seq;
    -- A delivery ends a run of refusals too: the alarm counts refusals in a row. The replicas'
    -- delivery rows in one order, as every sender takes them.
    RETURN QUERY
    WITH ending AS (
        SELECT d.replica, d.backoff IS NOT NULL AS was_backing_off
        FROM sync.delivery d
        WHERE d.replica = ANY (replicas) AND (d.backoff IS NOT NULL OR d.refusals > 0)
        ORDER BY d.replica
        FOR UPDATE
    ),
    ended AS (
        UPDATE sync.delivery d SET backoff = NULL, backoff_until = NULL, last_error = NULL,
                                   refusals = 0, probe_at = NULL
        FROM ending
        WHERE d.replica = ending.replica
    )
    SELECT ending.replica FROM ending WHERE ending.was_backing_off;
    -- The relay refills the windows as soon as this commits.
    PERFORM sync_internal.wake();
END
$$;

-- One message taken: sync.sent of a batch of one. Returns true when this ended a backoff.
CREATE FUNCTION sync.sent(replica uuid, seq bigint) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT EXISTS (SELECT FROM sync.sent(ARRAY[replica], ARRAY[seq])) $$;

-- The message could not be delivered: the lease ends and the replica waits out a backoff that
-- starts at magic_sync.backoff and doubles up to magic_sync.backoff_max, while every other
-- replica carries on. `retry` false means the other side refused it (counted in `refusals`).
-- After a transient failure (the line: no answer, a timeout) a backoff longer than
-- magic_sync.probe_every is probed: every probe_every its head may go early (sync.next), so a
-- device whose line answers again is delivered within probe_every, not at the end of a backoff of
-- up to backoff_max. A probe that fails backs off as any failure does, and is probed again. A
-- refusal is not probed: the line answered.
-- Returns true when this failure started the replica's backoff, for the sender's log.
CREATE FUNCTION sync.failed(replica uuid, seq bigint, retry boolean, error text,
                            origin text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    first_wait interval := sync.setting('backoff')::interval;
    longest_wait interval := sync.setting('backoff_max')::interval;
    probe_every interval := sync.setting('probe_every')::interval;
    generation int;
    previous sync.delivery;
    wait interval;
    refused_in_a_row int;
BEGIN
    PERFORM sync_internal.relay_guard();
    UPDATE sync.outbox o SET lease_until = NULL, lease_pid = NULL, lease_backend_start = NULL
    WHERE o.replica = failed.replica AND o.seq = failed.seq AND o.sent_at IS NULL
      AND (failed.origin IS NULL OR failed.origin = sync_internal.origin())
    RETURNING o.gen INTO generation;
    IF NOT FOUND THEN
        -- Recorded sent already (another sender took it after this one's lease ended and
        -- delivered it), or gone: a late failure of a delivered message backs nothing off.
        RETURN false;
    END IF;
    SELECT d.* INTO previous FROM sync.delivery d
    WHERE d.replica = failed.replica AND d.gen = generation
    FOR UPDATE;
    wait := least(coalesce(previous.backoff * 2, first_wait), longest_wait);
    refused_in_a_row := coalesce(previous.refusals, 0) + CASE WHEN failed.retry THEN 0 ELSE 1 END;
    INSERT INTO sync.delivery AS d (replica, gen, backoff, backoff_until, last_error, refusals,
                                    probe_at)
    VALUES (failed.replica, generation, wait, now() + wait,
            left(coalesce(failed.error, 'unknown error'), 1000), refused_in_a_row,
            CASE WHEN failed.retry AND probe_every > interval '0' AND wait > probe_every
                 THEN now() + probe_every END)
    ON CONFLICT ON CONSTRAINT delivery_pkey DO UPDATE
    SET gen = excluded.gen, backoff = excluded.backoff, backoff_until = excluded.backoff_until,
        last_error = excluded.last_error, refusals = excluded.refusals,
        probe_at = excluded.probe_at;
    -- Refused as often as magic_sync.max_refusals allows: the relay's alarm is due now.
    IF refused_in_a_row >= sync.setting('max_refusals')::int THEN
        PERFORM sync_internal.wake();
    END IF;
    RETURN previous.backoff IS NULL;
END
$$;

-- For the sender's progress line: what is waiting, how many replicas are in backoff, and how long
-- the oldest unsent message has waited.
CREATE FUNCTION sync.backlog(OUT unsent bigint, OUT in_backoff bigint, OUT oldest_unsent interval)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (SELECT count(*) FROM sync.outbox o JOIN sync.replica r ON r.id = o.replica
            WHERE r.live AND o.sent_at IS NULL),
           (SELECT count(*) FROM sync.replica r
            JOIN sync.current_delivery d ON d.replica = r.id
            WHERE r.live AND d.backoff_until > now()),
           (SELECT now() - min(o.created_at) FROM sync.outbox o JOIN sync.replica r ON r.id = o.replica
            WHERE r.live AND o.sent_at IS NULL)
$$;

-- The replica's device was heard from (it asked for a message, or an upload of it came): a
-- backoff its deliveries wait out ends now, so its head goes at the next look (a push sender looks
-- every second at least). The figures of the failure (backoff, refusals, last error) stay until a
-- delivery is taken (sync.sent). Called in the transaction that heard it.
CREATE FUNCTION sync_internal.device_heard(replica uuid) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE sync.delivery d SET backoff_until = now(), probe_at = NULL
    FROM sync.replica r
    WHERE d.replica = device_heard.replica AND r.id = d.replica AND r.gen = d.gen
      AND d.backoff_until > now();
END
$$;

-- The pull transport (magic-sync-sender --transport pull): a device behind NAT asks for its
-- replica's head message and acknowledges it, through the sender's HTTP server.
-- pull_head leases the replica's head (its lowest unsent seq) for `lease` and returns it, when the
-- replica is live. A pull lease names no session: it holds by its time alone (sync_internal.lease_holds),
-- because the device holds the message, not the database session that happened to serve it. So a
-- device that asks again (its answer was lost, it restarted) gets the same head, through whichever
-- sender and connection, and its lease is renewed. While the lease holds the head stays the head:
-- the pass writes only full messages behind it and does not prune it when the replica confirms it
-- (apply_confirmations), so its message_id stays valid until pull_ack. A head a push sender's
-- session holds (sync.next) is not served: that sender is delivering it. A replica another
-- transport delivers (sync.replica.transport) is refused. The replica's backoff is not looked at:
-- a device asks when it can, and its ask ends the backoff (sync_internal.device_heard).
-- The message comes as its bytes (`message`), assembled (sync.message) when it is a rows message,
-- unless `by_reference`: then a rows message comes by reference, as sync.next gives it (`message`
-- NULL, its envelope and its chunks' ids in `gen` to `chunks`), and a message stored whole as its
-- bytes. magic-sync-sender's gateway asks for references: its workers share the chunks they
-- fetched (sync.chunks), so that a chunk is read once, not once per device it goes to.
CREATE FUNCTION sync.pull_head(replica uuid, lease interval, by_reference boolean DEFAULT false)
RETURNS TABLE (seq bigint, message_id text, message bytea, origin text, gen int, reset text[],
               drops text[], table_drops text[], chunks bigint[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    head sync.outbox;
    delivered_by text;
BEGIN
    PERFORM sync_internal.relay_guard();
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'sync.pull_head needs a positive lease (got %)', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT r.transport INTO delivered_by FROM sync.replica r WHERE r.id = pull_head.replica;
    IF delivered_by <> 'pull' THEN
        RAISE EXCEPTION 'replica % is delivered by %, not by the pull gateway', pull_head.replica,
                        CASE WHEN delivered_by = '' THEN 'no transport'
                             ELSE 'transport ' || quote_literal(delivered_by) END
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Its row of the replicas relation names the transport that delivers it '
                         '(sync.replicas(transport => ...)): ''pull'' for a device that asks.';
    END IF;
    LOOP
        SELECT o.* INTO head FROM sync.outbox o JOIN sync.replica r ON r.id = o.replica
        WHERE o.replica = pull_head.replica AND o.sent_at IS NULL AND r.live
        ORDER BY o.seq LIMIT 1;
        IF NOT FOUND THEN
            PERFORM sync_internal.device_heard(pull_head.replica);
            RETURN;
        END IF;
        -- Locked, it is still the head unless it was acknowledged meanwhile: then look again.
        SELECT o.* INTO head FROM sync.outbox o
        WHERE o.replica = head.replica AND o.seq = head.seq AND o.sent_at IS NULL
        FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    -- The head first, then the delivery row: the order sync.sent takes them in.
    PERFORM sync_internal.device_heard(pull_head.replica);
    IF head.lease_pid IS NOT NULL AND sync_internal.lease_holds(head) THEN
        RETURN;
    END IF;
    UPDATE sync.outbox o
    SET lease_until = now() + lease, lease_pid = NULL, lease_backend_start = NULL,
        tries = o.tries + 1
    WHERE o.replica = head.replica AND o.seq = head.seq;
    PERFORM sync_internal.lease_commits_durably();
    IF pull_head.by_reference AND head.body IS NULL THEN
        RETURN QUERY SELECT head.seq, sync_internal.message_id(head.gen, head.seq), NULL::bytea,
                            sync_internal.origin(), head.gen, head.reset, head.drops,
                            head.table_drops, head.chunks;
    ELSE
        RETURN QUERY SELECT head.seq, sync_internal.message_id(head.gen, head.seq),
                            coalesce(head.body, sync.message(head.replica, head.seq)),
                            sync_internal.origin(), NULL::int, NULL::text[], NULL::text[],
                            NULL::text[], NULL::bigint[];
    END IF;
END
$$;

-- The seq of the replica's head when `message_id` names it and its lease is the pull gateway's
-- (sync.pull_head: a lease that names no session), locked (two devices' or two requests' answers
-- about one message at once: the second finds it sent); NULL otherwise. A head a push sender
-- leased is that sender's to record: a device's answer about it takes nothing.
CREATE FUNCTION sync_internal.pull_named_head(replica uuid, message_id text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    head record;
BEGIN
    SELECT o.seq, o.gen, o.lease_pid, o.lease_until INTO head FROM sync.outbox o
    WHERE o.replica = pull_named_head.replica AND o.sent_at IS NULL
    ORDER BY o.seq LIMIT 1
    FOR UPDATE;
    IF NOT FOUND OR sync_internal.message_id(head.gen, head.seq) IS DISTINCT FROM pull_named_head.message_id
       OR head.lease_pid IS NOT NULL OR head.lease_until IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN head.seq;
END
$$;

-- The device took message `message_id`: recorded sent (sync.sent) when it names the replica's
-- head, and then true. Anything else takes nothing and returns false: an ack that comes twice,
-- or after its lease ran out and the relay provisioned the replica again (another generation), or
-- that names a message that is not the head.
CREATE FUNCTION sync.pull_ack(replica uuid, message_id text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seq bigint := sync_internal.pull_named_head(pull_ack.replica, pull_ack.message_id);
BEGIN
    PERFORM sync_internal.relay_guard();
    IF seq IS NULL THEN
        RETURN false;
    END IF;
    PERFORM sync.sent(pull_ack.replica, seq);
    RETURN true;
END
$$;

-- The device could not take message `message_id`: recorded as a push sender's refusal is
-- (sync.failed with retry false: the replica's refusals and last error, the operator's alarm),
-- when it names the replica's head, and then true; anything else records nothing and returns
-- false. A reason that begins with "unknown version" (the message speaks a protocol version the
-- device does not) is recorded as a push sender's HTTP 422 is, not now (retry true): refusals in
-- a row provision a replica again, with messages it cannot read either. The message stays the
-- head: the device asks for it again when it may take it (after an upgrade), and nothing behind
-- it is lost.
CREATE FUNCTION sync.pull_refused(replica uuid, message_id text, error text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seq bigint := sync_internal.pull_named_head(pull_refused.replica, pull_refused.message_id);
BEGIN
    PERFORM sync_internal.relay_guard();
    IF seq IS NULL THEN
        RETURN false;
    END IF;
    PERFORM sync.failed(pull_refused.replica, seq,
                        starts_with(coalesce(pull_refused.error, ''), 'unknown version'),
                        pull_refused.error);
    RETURN true;
END
$$;

-- For the pull gateway, once per wake-up: of the replicas whose devices wait for a message
-- (`replicas`), the live ones with an unsent message. One statement however many devices wait,
-- where asking sync.pull_head for each would cost a statement per waiting device at every NOTIFY.
CREATE FUNCTION sync.pull_waiting(replicas uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM sync_internal.relay_guard();
    RETURN QUERY
    SELECT r.id FROM sync.replica r
    WHERE r.id = ANY (replicas) AND r.live
      AND EXISTS (SELECT FROM sync.outbox o WHERE o.replica = r.id AND o.sent_at IS NULL);
END
$$;

REVOKE ALL ON FUNCTION sync.next(int, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.next(int, interval, uuid[], int, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.chunks(bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.sent(uuid, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.sent(uuid[], bigint[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.failed(uuid, bigint, boolean, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.backlog() FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.pull_head(uuid, interval, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.pull_ack(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.pull_refused(uuid, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync.pull_waiting(uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION sync_internal.device_heard(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sync.next(int, interval) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.next(int, interval, uuid[], int, text, boolean) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.chunks(bigint[], text) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.sent(uuid, bigint) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.sent(uuid[], bigint[], text[]) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.failed(uuid, bigint, boolean, text, text) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.backlog() TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.pull_head(uuid, interval, boolean) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.pull_ack(uuid, text) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.pull_refused(uuid, text, text) TO sync_sender;
GRANT EXECUTE ON FUNCTION sync.pull_waiting(uuid[]) TO sync_sender;
