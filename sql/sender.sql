-- The sender's functions: sync.next leases the head message of each replica (or a run from it),
-- sync.sent and sync.failed settle it (docs/DESIGN.md §5). Messages here carry their bytes in `body`.
\set SHOW_CONTEXT never

-- Until the relay assembles messages from chunks (sync.message), a stand-in lets sync.next plan.
DO $$
BEGIN
    IF to_regprocedure('sync.message(uuid,bigint)') IS NULL THEN
        CREATE FUNCTION sync.message(uuid, bigint) RETURNS bytea
        LANGUAGE sql AS 'SELECT NULL::bytea';
    END IF;
END
$$;

SET magic_sync.backoff = '100ms';
SET magic_sync.backoff_max = '350ms';

INSERT INTO sync.replica (id, gen) VALUES
    ('00000000-0000-0000-0000-00000000000a', 3),
    ('00000000-0000-0000-0000-00000000000b', 1),
    ('00000000-0000-0000-0000-00000000000c', 1);
UPDATE sync.replica SET live = false WHERE id = '00000000-0000-0000-0000-00000000000c';
INSERT INTO sync.outbox (replica, seq, gen, kind, body)
SELECT r, s, g, 'rows', convert_to(format('{"replica":"%s","seq":%s}', r, s), 'UTF8')
FROM (VALUES ('00000000-0000-0000-0000-00000000000a'::uuid, 3),
             ('00000000-0000-0000-0000-00000000000b'::uuid, 1),
             ('00000000-0000-0000-0000-00000000000c'::uuid, 1)) AS replicas(r, g),
     generate_series(1, 3) AS s;

-- One message per live replica, its head, with the id <gen>.<seq>; the dead replica gets nothing.
SELECT replica, seq, message_id, convert_from(message, 'UTF8') AS message
FROM sync.next(10, '1 minute') ORDER BY replica;
-- The lease is this session's: its pid and its start (a later session may get the same pid).
SELECT replica, seq, tries, lease_until > now() AS leased, lease_pid = pg_backend_pid() AS this_pid,
       lease_backend_start = (SELECT backend_start FROM pg_stat_activity
                              WHERE pid = pg_backend_pid()) AS this_session
FROM sync.outbox WHERE tries > 0 ORDER BY replica, seq;

-- While a head is leased its replica is skipped: its second message never goes before the first.
SELECT count(*) AS while_leased FROM sync.next(10, '1 minute');

-- Sent: the next message becomes the head; the sent one stays in the outbox, unleased.
SELECT sync.sent('00000000-0000-0000-0000-00000000000a', 1) AS recovered;
SELECT replica, seq, message_id FROM sync.next(10, '1 minute');
SELECT seq, sent_at IS NOT NULL AS sent,
       num_nonnulls(lease_until, lease_pid, lease_backend_start) = 0 AS unleased FROM sync.outbox
WHERE replica = '00000000-0000-0000-0000-00000000000a' ORDER BY seq;

-- A lease that ran out lets the message go again (its sender hung, its session open): same id,
-- one more try.
UPDATE sync.outbox SET lease_until = now() - interval '1 second'
WHERE replica = '00000000-0000-0000-0000-00000000000b' AND seq = 1;
SELECT replica, seq, message_id FROM sync.next(10, '1 minute');
SELECT tries FROM sync.outbox WHERE replica = '00000000-0000-0000-0000-00000000000b' AND seq = 1;

-- A lease holder is a session: it lives while a session has its pid and its start. No session
-- named: the lease holds by its time alone.
SELECT sync_internal.session_lives(pg_backend_pid(), (SELECT backend_start FROM pg_stat_activity
                                             WHERE pid = pg_backend_pid())) AS this_session,
       sync_internal.session_lives(pg_backend_pid(), '2000-01-01') AS earlier_session_of_this_pid,
       sync_internal.session_lives(0, '2000-01-01') AS no_such_session,
       sync_internal.session_lives(NULL, NULL) AS none_named;

-- Failed, transient: the lease ends, the replica backs off for magic_sync.backoff and the error is
-- kept; the first failure starts the backoff (true), the next ones do not. (In one transaction,
-- whose now() the backoff is measured against: 100 ms of a loaded machine's time may pass between
-- two statements.)
BEGIN;
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 1, true, 'HTTP 503') AS started;
SELECT backoff, backoff_until > now() AS waiting, last_error, refusals FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT count(*) AS during_backoff FROM sync.next(10, '1 minute')
WHERE replica = '00000000-0000-0000-0000-00000000000b';
COMMIT;

-- Refused: the same backoff, doubled, and counted; it never exceeds magic_sync.backoff_max.
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 1, false, 'HTTP 400: bad message') AS started;
SELECT backoff, last_error, refusals FROM sync.delivery WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 1, true, 'timeout') AS started;
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 1, true, 'timeout') AS started;
SELECT backoff, last_error, refusals FROM sync.delivery WHERE replica = '00000000-0000-0000-0000-00000000000b';

-- After the backoff the replica's head goes again, under the same id; once it is taken the
-- backoff, the error and the run of refusals are cleared (sent returns true: it recovered).
UPDATE sync.delivery SET backoff_until = now() - interval '1 second'
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT replica, seq, message_id FROM sync.next(10, '1 minute');
SELECT sync.sent('00000000-0000-0000-0000-00000000000b', 1) AS recovered;
SELECT backoff, backoff_until, last_error, refusals FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-00000000000b';

-- Sent twice (a late answer) changes nothing; a forgotten replica's outcome is ignored.
SELECT sync.sent('00000000-0000-0000-0000-00000000000b', 1) AS recovered;
SELECT sync.failed('00000000-0000-0000-0000-0000000000ff', 1, true, 'gone') AS started;

-- In batches, as the sender calls them: sync.next with `among` looks only at those replicas, and
-- sync.sent with arrays records many messages at once and returns the replicas that recovered.
SELECT replica, seq, message_id FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000b']::uuid[], 1);
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 2, true, 'HTTP 503') AS started;
UPDATE sync.delivery SET backoff_until = now() - interval '1 second'
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT replica, seq, message_id FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000b', '00000000-0000-0000-0000-00000000000b']::uuid[], 1);
SELECT recovered FROM sync.sent(ARRAY['00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-00000000000b']::uuid[], ARRAY[2, 2]) AS recovered;
SELECT replica, seq, sent_at IS NOT NULL AS sent,
       num_nonnulls(lease_until, lease_pid, lease_backend_start) = 0 AS unleased FROM sync.outbox
WHERE seq = 2 AND replica IN ('00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-00000000000b')
ORDER BY replica;
SELECT backoff, last_error FROM sync.delivery WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT * FROM sync.sent(ARRAY['00000000-0000-0000-0000-00000000000a']::uuid[], ARRAY[3, 4]);
SELECT count(*) AS among_nobody FROM sync.next(10, '1 minute', '{}', 1);

-- A backoff longer than magic_sync.probe_every after a transient failure (the line) is probed:
-- every probe_every the head may go early, though the backoff has not ended, so a device whose
-- line answers again is delivered within probe_every. A probe that fails backs off further and
-- is probed again; a refusal (the line answered, the device said no) is not probed.
SET magic_sync.backoff = '10min';
SET magic_sync.backoff_max = '1h';
SET magic_sync.probe_every = '5s';
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 3, true, 'connection refused') AS started;
SELECT backoff, probe_at - now() BETWEEN interval '4 seconds' AND interval '5 seconds' AS probe_in_5s
FROM sync.delivery WHERE replica = '00000000-0000-0000-0000-00000000000b';
-- What sync.status says of it (its seconds as N).
SELECT state, regexp_replace(state_detail, '[0-9]+ s\M', 'N s', 'g') AS state_detail FROM sync.status
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT count(*) AS before_the_probe FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000b']::uuid[], 1);
UPDATE sync.delivery SET probe_at = now() - interval '1 millisecond'
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT replica, seq, message_id AS probe FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000b']::uuid[], 1);
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 3, true, 'connection refused') AS started;
SELECT backoff, backoff_until > now() + interval '19 minutes' AS backing_off,
       probe_at - now() BETWEEN interval '4 seconds' AND interval '5 seconds' AS probe_in_5s
FROM sync.delivery WHERE replica = '00000000-0000-0000-0000-00000000000b';
UPDATE sync.delivery SET probe_at = now() - interval '1 millisecond'
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT replica, seq, message_id AS probe FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000b']::uuid[], 1);
SELECT sync.failed('00000000-0000-0000-0000-00000000000b', 3, false, 'HTTP 400: bad message') AS started;
SELECT probe_at IS NULL AS refusal_not_probed FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SELECT state, regexp_replace(state_detail, '[0-9]+ s\M', 'N s', 'g') AS state_detail FROM sync.status
WHERE replica = '00000000-0000-0000-0000-00000000000b';
UPDATE sync.delivery SET backoff = NULL, backoff_until = NULL, last_error = NULL, refusals = 0,
                         probe_at = NULL
WHERE replica = '00000000-0000-0000-0000-00000000000b';
SET magic_sync.backoff = '100ms';
SET magic_sync.backoff_max = '350ms';
RESET magic_sync.probe_every;

-- Runs: with run > 1 the head is leased and returned with the messages after it, in order; the
-- lease is held by the head alone, and covers the run: nobody else gets any of it.
INSERT INTO sync.replica (id, gen) VALUES ('00000000-0000-0000-0000-00000000000d', 2);
INSERT INTO sync.outbox (replica, seq, gen, kind, body)
SELECT '00000000-0000-0000-0000-00000000000d', s, 2, 'rows', convert_to(format('{"seq":%s}', s), 'UTF8')
FROM generate_series(1, 5) AS s;
SELECT replica, seq, message_id, convert_from(message, 'UTF8') AS message
FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000d']::uuid[], 3);
SELECT seq, lease_until IS NOT NULL AS leased, tries FROM sync.outbox
WHERE replica = '00000000-0000-0000-0000-00000000000d' ORDER BY seq;
SELECT count(*) AS while_run_leased
FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000d']::uuid[], 3);

-- The run recorded sent: the next one starts after it, and ends with the last message there is.
SELECT * FROM sync.sent(ARRAY['00000000-0000-0000-0000-00000000000d', '00000000-0000-0000-0000-00000000000d', '00000000-0000-0000-0000-00000000000d']::uuid[], ARRAY[1, 2, 3]);
SELECT replica, seq, message_id FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000d']::uuid[], 3);

-- One failed in the middle of a run: what was taken before it is recorded sent, the replica backs
-- off, and after the backoff its next run starts with the message that failed.
SELECT * FROM sync.sent(ARRAY['00000000-0000-0000-0000-00000000000d']::uuid[], ARRAY[4]);
BEGIN;
SELECT sync.failed('00000000-0000-0000-0000-00000000000d', 5, true, 'HTTP 503') AS started;
SELECT count(*) AS during_backoff FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000d']::uuid[], 3);
COMMIT;
UPDATE sync.delivery SET backoff_until = now() - interval '1 second'
WHERE replica = '00000000-0000-0000-0000-00000000000d';
SELECT replica, seq, message_id FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000d']::uuid[], 3);
SELECT * FROM sync.sent(ARRAY['00000000-0000-0000-0000-00000000000d']::uuid[], ARRAY[5]);

-- n limits how many replicas are leased; bad arguments are refused.
SELECT count(*) AS leased FROM sync.next(1, '1 minute');
SELECT * FROM sync.next(0, '1 minute');
SELECT * FROM sync.next(1, '-1 second');
SELECT * FROM sync.next(1, '1 minute', NULL, 0);

-- What a sender had in flight when it reconnected to another history (a restore, a failover) is
-- not recorded against the message of that seq here: sync.next returned the origin with each
-- message, and sync.sent and sync.failed take it back.
INSERT INTO sync.replica (id, gen) VALUES ('00000000-0000-0000-0000-00000000000e', 1);
INSERT INTO sync.outbox (replica, seq, gen, kind, body)
VALUES ('00000000-0000-0000-0000-00000000000e', 1, 1, 'rows', convert_to('{"seq":1}', 'UTF8'));
SELECT count(*) AS leased, bool_and(origin = sync_internal.origin()) AS origin_returned
FROM sync.next(1, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000e']::uuid[], 1);
SELECT count(*) AS recovered FROM sync.sent(ARRAY['00000000-0000-0000-0000-00000000000e']::uuid[],
                                           ARRAY[1], ARRAY['1/1/00000000-0000-0000-0000-000000000000']);
SELECT sync.failed('00000000-0000-0000-0000-00000000000e', 1, false, 'refused: another history',
                   '1/1/00000000-0000-0000-0000-000000000000') AS started;
SELECT sent_at IS NULL AS unsent, lease_until IS NOT NULL AS still_leased FROM sync.outbox
WHERE replica = '00000000-0000-0000-0000-00000000000e';
SELECT backoff, refusals FROM sync.delivery WHERE replica = '00000000-0000-0000-0000-00000000000e';
SELECT count(*) AS recovered FROM sync.sent(ARRAY['00000000-0000-0000-0000-00000000000e']::uuid[],
                                           ARRAY[1], ARRAY[sync_internal.origin()]);
SELECT sent_at IS NOT NULL AS sent FROM sync.outbox WHERE replica = '00000000-0000-0000-0000-00000000000e';

-- The backlog, for the sender's progress line.
SELECT unsent, in_backoff, oldest_unsent IS NOT NULL AS has_oldest FROM sync.backlog();

-- A look at every replica walks the unsent messages oldest first (outbox_unsent_age), a batch of
-- n * 8 + 64 at a time, and stops once it holds `n` heads: with 2,000 replicas waiting, each with
-- two messages, the two oldest and half of the others in backoff, leasing 3 (replicas 3, 4 and 5)
-- reads one batch of 88 entries and a few replicas, not every replica's head (the look found all
-- of them and sorted them: O(replicas) per look).
INSERT INTO sync.replica (id, gen)
SELECT ('00000000-0000-0000-0001-' || lpad(g::text, 12, '0'))::uuid, 1 FROM generate_series(1, 2000) g;
INSERT INTO sync.outbox (replica, seq, gen, kind, body, created_at)
SELECT ('00000000-0000-0000-0001-' || lpad(g::text, 12, '0'))::uuid, s, 1, 'rows', '\x00',
       timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second'
FROM generate_series(1, 2000) g, generate_series(1, 2) s;
INSERT INTO sync.delivery (replica, gen, backoff, backoff_until)
SELECT ('00000000-0000-0000-0001-' || lpad(g::text, 12, '0'))::uuid, 1, interval '1 minute',
       now() + interval '1 minute'
FROM generate_series(1, 2000) g WHERE g <= 2 OR g >= 1000;
ANALYZE sync.replica, sync.outbox, sync.delivery;
-- The backend's counts of what was read, before and after (they hold what earlier statements
-- read too until they are reported).
CREATE TEMP VIEW reads AS
SELECT pg_stat_get_xact_tuples_returned('sync.outbox_unsent_age'::regclass) AS walked,
       pg_stat_get_xact_tuples_returned('sync.replica'::regclass)
       + pg_stat_get_xact_tuples_fetched('sync.replica'::regclass) AS replicas,
       pg_stat_get_xact_tuples_returned('sync.outbox'::regclass)
       + pg_stat_get_xact_tuples_fetched('sync.outbox'::regclass) AS messages;
BEGIN;
SELECT walked AS walked_before, replicas AS replicas_before FROM reads \gset
SELECT replica, seq FROM sync.next(3, '1 minute') ORDER BY replica;
SELECT walked - :walked_before AS entries_walked, replicas - :replicas_before < 20 AS few_replicas_read
FROM reads;
ROLLBACK;
-- A look at replicas named reads those replicas, not every replica (its generic plan once hashed
-- every replica at every such look).
BEGIN;
SELECT replicas AS replicas_before FROM reads \gset
SELECT replica, seq FROM sync.next(3, '1 minute', ARRAY['00000000-0000-0000-0001-000000000007',
                                                        '00000000-0000-0000-0001-000000000008']::uuid[], 1)
ORDER BY replica;
SELECT replicas - :replicas_before < 20 AS few_replicas_read FROM reads;
ROLLBACK;
-- When the oldest messages wait for replicas in backoff (here 600, 1,200 messages: more than
-- eight batches), the look does not walk past them all but looks at every replica's head.
UPDATE sync.delivery SET backoff = interval '1 minute', backoff_until = now() + interval '1 minute'
WHERE replica::text LIKE '00000000-0000-0000-0001-%';
INSERT INTO sync.delivery (replica, gen, backoff, backoff_until)
SELECT ('00000000-0000-0000-0001-' || lpad(g::text, 12, '0'))::uuid, 1, interval '1 minute',
       now() + interval '1 minute'
FROM generate_series(3, 600) g;
BEGIN;
SELECT walked AS walked_before, replicas AS replicas_before FROM reads \gset
SELECT replica, seq FROM sync.next(3, '1 minute') ORDER BY replica;
SELECT walked - :walked_before AS entries_walked, replicas - :replicas_before >= 2000 AS every_replica_read
FROM reads;
ROLLBACK;
-- The relay's look for a message left unconfirmed too long, at every pass (when it is next due,
-- sync_internal.next_due, and whether to alarm, sync_internal.alarms), reads the oldest sent
-- message through outbox_sent, not every sent message nor every replica; and whether a replica's
-- next message must carry a reset or drops through replica_pending: with none pending, the look
-- once read every replica...
UPDATE sync.outbox SET sent_at = now() WHERE replica::text LIKE '00000000-0000-0000-0001-%';
BEGIN;
UPDATE sync.replica SET reset_pending = false, pending_drops = '{}', pending_table_drops = '{}';
ANALYZE sync.replica;
-- ...and each confirmation's messages by key, though the queue of confirmations was long when its
-- statistics were taken (the look hashed the whole outbox then).
INSERT INTO sync.confirmation (replica, applied) SELECT id, 1 FROM sync.replica;
ANALYZE sync.confirmation;
DELETE FROM sync.confirmation;
INSERT INTO sync.confirmation (replica, applied)
VALUES ('00000000-0000-0000-0001-000000000007', 1), ('00000000-0000-0000-0001-000000000008', 2);
SELECT replicas AS replicas_before, messages AS messages_before FROM reads \gset
SELECT pass_at IS NOT NULL AS due FROM sync_internal.next_due('1 hour', '1 day', 10, '2 days');
SELECT count(*) AS alarmed FROM sync_internal.alarms();
SELECT replicas - :replicas_before < 20 AS few_replicas_read, messages - :messages_before < 20 AS few_messages_read
FROM reads;
ROLLBACK;
DROP VIEW reads;
DELETE FROM sync.replica WHERE id::text LIKE '00000000-0000-0000-0001-%';

-- The window rule (sync_internal.outbox_room) counts a replica's messages from its first unsent
-- one to its last, by key: a message left unsent between sent ones (sync.sent skipped it while
-- another transaction held it) counts until it goes, so the window is never overrun.
INSERT INTO sync.replica (id, gen, next_seq) VALUES ('00000000-0000-0000-0002-000000000001', 1, 4);
INSERT INTO sync.outbox (replica, seq, gen, kind, body, sent_at)
VALUES ('00000000-0000-0000-0002-000000000001', 1, 1, 'rows', '\x00', NULL),
       ('00000000-0000-0000-0002-000000000001', 2, 1, 'rows', '\x00', now()),
       ('00000000-0000-0000-0002-000000000001', 3, 1, 'rows', '\x00', NULL);
SELECT sync_internal.outbox_room('00000000-0000-0000-0002-000000000001', 8) AS room_with_a_hole,
       sync_internal.outbox_room('00000000-0000-0000-0002-00000000ffff', 8) AS room_of_no_replica;
UPDATE sync.outbox SET sent_at = now() WHERE replica = '00000000-0000-0000-0002-000000000001';
SELECT sync_internal.outbox_room('00000000-0000-0000-0002-000000000001', 8) AS room_all_sent;
DELETE FROM sync.replica WHERE id = '00000000-0000-0000-0002-000000000001';

-- Asked for by reference (as the sender asks), a rows message comes as its envelope and the ids of
-- its chunks, in order (the sender fetches the chunks it does not hold with sync.chunks and
-- assembles the message as sync.message does); a message stored whole comes as its bytes, with no
-- reference. Otherwise every message comes assembled.
INSERT INTO sync.replica (id, gen) VALUES ('00000000-0000-0000-0000-00000000000f', 3);
INSERT INTO sync.scope (match, value) VALUES ('sender_test', '1');
INSERT INTO sync.chunk (id, scope, from_seq, to_seq, built_head, rows, bytes, body, withheld)
SELECT c.id, s.id, c.from_seq, c.to_seq, c.to_seq, 0, 0, c.body, c.withheld
FROM sync.scope s, (VALUES
    (1001, 0, 2, '{"scope":"sender_test=1","from":0,"to":2,"rows":[]}',
     '[{"t":"items","k":{"id":7, "name":"x"},"why":"too big"},
       {"t":"items","kh":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","why":"number past double"}]'::jsonb),
    (1002, 2, 4, '{"scope":"sender_test=1","from":2,"to":4,"rows":[]}', '[]')) AS c(id, from_seq, to_seq, body, withheld)
WHERE s.match = 'sender_test';
INSERT INTO sync.outbox (replica, seq, gen, kind, chunks, reset, drops, table_drops, body)
VALUES ('00000000-0000-0000-0000-00000000000f', 1, 3, 'rows', '{1002,1001}', '{*}', '{sender_test=2}',
        '{old_items}', NULL),
       ('00000000-0000-0000-0000-00000000000f', 2, 3, 'ranges', '{}', '{}', '{}', '{}',
        convert_to('{"kind":"ranges"}', 'UTF8'));
BEGIN;
SELECT seq, message = sync.message(replica, seq) AS assembled, gen, reset, drops, table_drops, chunks
FROM sync.next(1, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000f']::uuid[], 2);
ROLLBACK;
SELECT seq, message_id, convert_from(message, 'UTF8') AS message, gen, reset, drops, table_drops, chunks
FROM sync.next(1, '1 minute', ARRAY['00000000-0000-0000-0000-00000000000f']::uuid[], 2, by_reference => true);
-- Each chunk's body and its withheld notes in order (a key canonical, or NULL and its hash); a
-- chunk that is gone is not returned.
SELECT id, body, withheld_tables, withheld_keys, withheld_whys, withheld_key_hashes
FROM sync.chunks('{1002,1001,1003}', sync_internal.origin()) ORDER BY id;
-- Nothing for another history: a restored or re-created database numbers its chunks again.
SELECT count(*) AS of_another_history
FROM sync.chunks('{1001,1002}', '1/1/00000000-0000-0000-0000-000000000000');
-- sync.message assembles the message from the same chunks: the envelope, the chunks in the
-- message's order, their notes after them.
SELECT convert_from(sync.message('00000000-0000-0000-0000-00000000000f', 1), 'UTF8') AS assembled;
-- A message one of whose chunks is gone is not assembled without it (it was, silently).
BEGIN;
DELETE FROM sync.chunk WHERE id = 1001;
SELECT sync.message('00000000-0000-0000-0000-00000000000f', 1);
ROLLBACK;
DELETE FROM sync.replica WHERE id = '00000000-0000-0000-0000-00000000000f';
DELETE FROM sync.chunk WHERE id IN (1001, 1002);
DELETE FROM sync.scope WHERE match = 'sender_test';

-- Only sync_sender may call them; they run as the extension's owner with a pinned search_path.
SELECT p.proname, p.prosecdef AS security_definer, p.proconfig,
       has_function_privilege('sync_sender', p.oid, 'EXECUTE') AS sender_can,
       has_function_privilege('sync_receiver', p.oid, 'EXECUTE') AS receiver_can,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_can
FROM pg_proc p
WHERE p.pronamespace = 'sync'::regnamespace AND p.proname IN ('next', 'chunks', 'sent', 'failed', 'backlog')
ORDER BY p.proname;
CREATE ROLE sender_login LOGIN IN ROLE sync_sender;
CREATE ROLE stranger LOGIN;
SET ROLE sender_login;
SELECT count(*) AS as_sender FROM sync.next(10, '1 minute');
SELECT count(*) AS chunks_as_sender FROM sync.chunks('{1}', '1/1/00000000-0000-0000-0000-000000000000');
SET ROLE stranger;
SELECT count(*) FROM sync.next(10, '1 minute');
SELECT count(*) FROM sync.chunks('{1}', '1/1/00000000-0000-0000-0000-000000000000');
RESET ROLE;
DROP ROLE sender_login;
DROP ROLE stranger;

DELETE FROM sync.replica WHERE id::text LIKE '00000000-0000-0000-0000-0000000000%';
