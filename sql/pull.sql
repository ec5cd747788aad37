-- The pull transport's functions (magic-sync-sender --transport pull): sync.pull_head leases a
-- replica's head to the device that asks for it, sync.pull_ack records it sent only when it names
-- the current head. Messages here carry their bytes in `body`.
\set SHOW_CONTEXT never

INSERT INTO sync.replica (id, gen) VALUES
    ('00000000-0000-0000-0000-0000000000e1', 4),
    ('00000000-0000-0000-0000-0000000000e2', 1),
    ('00000000-0000-0000-0000-0000000000e3', 1);
UPDATE sync.replica SET live = false WHERE id = '00000000-0000-0000-0000-0000000000e3';
INSERT INTO sync.outbox (replica, seq, gen, kind, body)
SELECT r, s, g, 'rows', convert_to(format('{"replica":"%s","seq":%s}', r, s), 'UTF8')
FROM (VALUES ('00000000-0000-0000-0000-0000000000e1'::uuid, 4),
             ('00000000-0000-0000-0000-0000000000e2'::uuid, 1),
             ('00000000-0000-0000-0000-0000000000e3'::uuid, 1)) AS replicas(r, g),
     generate_series(1, 3) AS s;

-- The head, with the id <gen>.<seq>, leased by its time alone (no session named).
SELECT seq, message_id, convert_from(message, 'UTF8') AS message
FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute');
SELECT seq, tries, lease_until > now() AS leased, lease_pid IS NULL AS no_session
FROM sync.outbox WHERE replica = '00000000-0000-0000-0000-0000000000e1' AND tries > 0;
-- While its lease holds, push senders skip it, and the relay treats the replica as in flight.
SELECT count(*) AS pushed FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-0000000000e1']::uuid[], 1);

-- Asked again (the answer was lost): the same head, the lease renewed, one more try.
UPDATE sync.outbox SET lease_until = now() + interval '1 second'
WHERE replica = '00000000-0000-0000-0000-0000000000e1' AND seq = 1;
SELECT seq, message_id FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute');
SELECT tries, lease_until > now() + interval '30 seconds' AS renewed
FROM sync.outbox WHERE replica = '00000000-0000-0000-0000-0000000000e1' AND seq = 1;

-- An ack of a message that is not the head takes nothing, nor does another generation's id.
SELECT sync.pull_ack('00000000-0000-0000-0000-0000000000e1', '4.2') AS not_the_head,
       sync.pull_ack('00000000-0000-0000-0000-0000000000e1', '3.1') AS other_generation,
       sync.pull_ack('00000000-0000-0000-0000-0000000000e1', 'nonsense') AS nonsense,
       sync.pull_ack('00000000-0000-0000-0000-0000000000e2', '4.1') AS other_replicas_id;
SELECT replica, seq FROM sync.outbox WHERE sent_at IS NOT NULL;

-- The head's ack takes it (sent, unleased, the backoff over); the next message is the head.
INSERT INTO sync.delivery (replica, gen, backoff, backoff_until, last_error)
SELECT id, gen, '1 minute', now() + interval '1 minute', 'HTTP 503' FROM sync.replica
WHERE id = '00000000-0000-0000-0000-0000000000e1';
SELECT sync.pull_ack('00000000-0000-0000-0000-0000000000e1', '4.1') AS taken;
SELECT seq, sent_at IS NOT NULL AS sent, lease_until IS NULL AS unleased
FROM sync.outbox WHERE replica = '00000000-0000-0000-0000-0000000000e1' ORDER BY seq;
SELECT backoff, backoff_until, last_error FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-0000000000e1';
-- Twice: the second takes nothing, not the new head either.
SELECT sync.pull_ack('00000000-0000-0000-0000-0000000000e1', '4.1') AS again;
SELECT count(*) AS sent FROM sync.outbox
WHERE replica = '00000000-0000-0000-0000-0000000000e1' AND sent_at IS NOT NULL;
SELECT seq, message_id FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute');

-- A device that cannot take its head says so: recorded as a refusal (as sync.failed records a
-- push transport's), the lease ends and the message stays the head; a refusal naming anything
-- else records nothing.
SELECT sync.pull_refused('00000000-0000-0000-0000-0000000000e1', '4.3', 'malformed: not a message') AS refused_behind;
SELECT sync.pull_refused('00000000-0000-0000-0000-0000000000e1', '4.2', 'malformed: no chunks') AS refused;
SELECT refusals, last_error, backoff IS NOT NULL AS backing_off FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-0000000000e1';
SELECT seq, sent_at IS NOT NULL AS sent, lease_until IS NULL AS unleased
FROM sync.outbox WHERE replica = '00000000-0000-0000-0000-0000000000e1' ORDER BY seq;
SELECT backoff_until > now() AS backing_off FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-0000000000e1';
-- The device asks again: answered at once, and its ask ends the backoff (the device is there);
-- the refusals and the error stay until a delivery is taken.
SELECT seq, message_id FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute');
SELECT backoff_until <= now() AS backoff_ended, refusals, last_error FROM sync.delivery
WHERE replica = '00000000-0000-0000-0000-0000000000e1';
-- A message of a protocol version the device does not speak is not a refusal: recorded, not
-- counted (refusals in a row would provision the replica again); the device waits for its upgrade.
SELECT sync.pull_refused('00000000-0000-0000-0000-0000000000e1', '4.2', 'unknown version: protocol 9') AS not_now;
SELECT refusals, last_error FROM sync.delivery WHERE replica = '00000000-0000-0000-0000-0000000000e1';
SELECT seq, message_id FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute');

-- A head a push sender's live session holds is not served: that sender is delivering it.
SELECT replica, seq FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-0000000000e2']::uuid[], 1);
SELECT count(*) AS pulled FROM sync.pull_head('00000000-0000-0000-0000-0000000000e2', '1 minute');
-- A replica not live gets nothing; nor does one with no outbox; a lease must be positive.
SELECT count(*) AS not_live FROM sync.pull_head('00000000-0000-0000-0000-0000000000e3', '1 minute');
SELECT count(*) AS unknown FROM sync.pull_head('00000000-0000-0000-0000-0000000000ff', '1 minute');
SELECT * FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '0 seconds');

-- A device's answer about a head a push sender holds takes nothing and records nothing: that
-- sender delivers it, and records it itself.
SELECT sync.pull_ack('00000000-0000-0000-0000-0000000000e2', '1.1') AS ack_of_a_pushed_head,
       sync.pull_refused('00000000-0000-0000-0000-0000000000e2', '1.1', 'no') AS refusal_of_it;
SELECT seq, sent_at IS NOT NULL AS sent, lease_pid = pg_backend_pid() AS still_pushed, tries
FROM sync.outbox WHERE replica = '00000000-0000-0000-0000-0000000000e2' AND seq = 1;
SELECT sync.failed('00000000-0000-0000-0000-0000000000e2', 1, true, 'line down');
UPDATE sync.delivery SET backoff = NULL, backoff_until = NULL, last_error = NULL
WHERE replica = '00000000-0000-0000-0000-0000000000e2';

-- Each replica is delivered by the transport its row names (sync.replica.transport): the pull
-- gateway serves only replicas it delivers (or any sender does), and a push sender leases only its
-- own transport's replicas.
UPDATE sync.replica SET transport = 'http' WHERE id = '00000000-0000-0000-0000-0000000000e2';
SELECT * FROM sync.pull_head('00000000-0000-0000-0000-0000000000e2', '1 minute');
UPDATE sync.replica SET transport = '' WHERE id = '00000000-0000-0000-0000-0000000000e2';
SELECT * FROM sync.pull_head('00000000-0000-0000-0000-0000000000e2', '1 minute');
UPDATE sync.replica SET transport = 'pull' WHERE id = '00000000-0000-0000-0000-0000000000e2';
SELECT count(*) AS pushed_by_http
FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-0000000000e2']::uuid[], 1, 'http');
SELECT count(*) AS pushed_by_a_sender_of_no_transport
FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-0000000000e2']::uuid[], 1);
SELECT seq, message_id FROM sync.pull_head('00000000-0000-0000-0000-0000000000e2', '1 minute');
SELECT sync.pull_ack('00000000-0000-0000-0000-0000000000e2', '1.1') AS pulled_and_taken;
UPDATE sync.replica SET transport = 'http' WHERE id = '00000000-0000-0000-0000-0000000000e2';
SELECT replica, seq
FROM sync.next(10, '1 minute', ARRAY['00000000-0000-0000-0000-0000000000e2']::uuid[], 1, 'http');
SELECT sync.sent('00000000-0000-0000-0000-0000000000e2', 2) AS recovered;
UPDATE sync.replica SET transport = NULL WHERE id = '00000000-0000-0000-0000-0000000000e2';

-- By reference (as magic-sync-sender's gateway asks): a rows message comes as its envelope and
-- its chunks' ids, the message NULL, as sync.next gives it; without, as sync.message assembles it,
-- the reference columns NULL; a message stored whole comes as its bytes either way.
INSERT INTO sync.replica (id, gen) VALUES ('00000000-0000-0000-0000-0000000000e4', 2);
INSERT INTO sync.scope (id, match, value) VALUES (1041, 'shop', '41');
INSERT INTO sync.chunk (id, scope, from_seq, to_seq, built_head, rows, bytes, body, withheld)
VALUES (1041, 1041, 0, 3, 3, 0, 0, '{"scope":"shop=41","from":0,"to":3,"rows":[]}', '[]');
INSERT INTO sync.outbox (replica, seq, gen, kind, chunks, reset, drops, table_drops, body)
VALUES ('00000000-0000-0000-0000-0000000000e4', 1, 2, 'rows', '{1041}', '{*}', '{shop=40}',
        '{old_items}', NULL);
SELECT seq, message_id, message IS NULL AS by_reference, origin = sync_internal.origin() AS origin,
       gen, reset, drops, table_drops, chunks
FROM sync.pull_head('00000000-0000-0000-0000-0000000000e4', '1 minute', by_reference => true);
SELECT seq, message_id, convert_from(message, 'UTF8') AS message, gen, reset, drops, table_drops, chunks
FROM sync.pull_head('00000000-0000-0000-0000-0000000000e4', '1 minute');
SELECT seq, message_id, convert_from(message, 'UTF8') AS message, gen, reset, drops, table_drops, chunks
FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute', by_reference => true);
DELETE FROM sync.replica WHERE id = '00000000-0000-0000-0000-0000000000e4';
DELETE FROM sync.chunk WHERE id = 1041;
DELETE FROM sync.scope WHERE id = 1041;

-- Only sync_sender may call them; they run as the extension's owner with a pinned search_path.
SELECT p.oid::regprocedure AS routine, p.prosecdef AS security_definer, p.proconfig,
       has_function_privilege('sync_sender', p.oid, 'EXECUTE') AS sender_can,
       has_function_privilege('sync_receiver', p.oid, 'EXECUTE') AS receiver_can,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_can
FROM pg_proc p
WHERE p.pronamespace = 'sync'::regnamespace AND p.proname IN ('pull_head', 'pull_ack', 'pull_refused')
ORDER BY p.proname;
CREATE ROLE pull_sender LOGIN IN ROLE sync_sender;
-- A role without sync_sender (here the receiver's, which may use the schema) may not.
CREATE ROLE pull_stranger LOGIN IN ROLE sync_receiver;
SET ROLE pull_sender;
SELECT seq, message_id FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute');
SELECT sync.pull_ack('00000000-0000-0000-0000-0000000000e1', '4.2') AS taken_as_sender;
SET ROLE pull_stranger;
SELECT * FROM sync.pull_head('00000000-0000-0000-0000-0000000000e1', '1 minute');
SELECT sync.pull_ack('00000000-0000-0000-0000-0000000000e1', '4.3');
SELECT sync.pull_refused('00000000-0000-0000-0000-0000000000e1', '4.3', 'no');
RESET ROLE;
SELECT count(*) AS sent_in_all FROM sync.outbox
WHERE replica = '00000000-0000-0000-0000-0000000000e1' AND sent_at IS NOT NULL;
DROP ROLE pull_sender;
DROP ROLE pull_stranger;

DELETE FROM sync.replica WHERE id::text LIKE '00000000-0000-0000-0000-0000000000e%';
