-- What each routine and view a user calls is for, as \df+ and \dv+ show it -----------------------
--
-- The documented surface (README, docs/DESIGN.md): what the extension's owner declares and runs,
-- and everything the roles sync_sender, sync_receiver and sync_monitor may execute. The regress
-- test `comments` fails when one of the roles may execute a routine without a comment here.
-- COMMENT ON replaces what was there, so the update script runs this part again as it is.

-- Declaring what syncs (src/declare/declare.sql)
COMMENT ON FUNCTION sync.replicas(regclass, text, text, name, name) IS
'Declares the relation (table or view, with an id uuid column) that lists the replicas: name names '
'the set in messages and logs, live is a boolean SQL expression over its columns (a replica is sent '
'rows while its row meets it), partitioned_by a column of it and of every synced table that no row '
'crosses, transport a column of it naming the transport that delivers each replica (http, nats, '
'exec or pull; without it every sender delivers every replica). One per database; declaring again '
'replaces it.';
COMMENT ON FUNCTION sync.catalog(regclass, text, name[]) IS
'Declares a table whose rows the server writes and sends down (to: ''all'' by default, a column '
'holding a replica id, ''col = replica_col'', or NULL for nobody; columns: what travels, all by '
'default). An upload of one of its rows is refused and kept.';
COMMENT ON FUNCTION sync.record(regclass, text, name[], name[]) IS
'Declares a table of facts replicas create and upload: a row is filed insert-if-absent by its '
'primary key, so a second delivery changes nothing. Sent down to no one unless to says who; stamp '
'names columns filed from what known returned (sync.senders).';
COMMENT ON FUNCTION sync."both"(regclass, text, name[], name[], name[]) IS
'Declares a table both sides write: its rows go down whole to the audience of to, and an upload '
'changes only replica_columns, and only on rows of the uploading replica''s own audience.';
COMMENT ON FUNCTION sync.senders(regprocedure, regprocedure) IS
'Says how uploads are filed: known(uuid) returns jsonb, what the server knows of a replica that '
'uploads (NULL: unknown, its upload dropped; default: known when live); filing(jsonb) runs first in '
'every filing to set what row policies read.';
COMMENT ON FUNCTION sync.drop(regclass) IS
'Stops syncing a table: every replica that holds rows of it is told to drop the table, and the '
'relay forgets its rows.';
COMMENT ON FUNCTION sync.end_codec(integer) IS
'Stops syncing a table by its codec id (as sync."check"() names it), for a table that no longer '
'exists: every replica that holds rows of it is told to drop the table, and the relay forgets its '
'rows.';
COMMENT ON FUNCTION sync."check"() IS
'One row per problem with the declarations now (a schema change that broke one, a grant filing '
'or the senders'' known() and filing() lack, found by running them as each role that files, '
'rolled back), with the fix to run. No rows: nothing to fix.';
COMMENT ON VIEW sync.declarations IS
'What is declared, for reading: the replicas relation, then per synced table its kind, its rule as '
'declared and in words, the columns that travel, the ones a replica may write, the stamps and the '
'key.';
COMMENT ON FUNCTION sync.audience_sql(integer, text, text) IS
'A codec''s routing rule as a boolean SQL expression, true when the row aliased row_alias is in the '
'audience of the replicas-relation row aliased replica_alias, partition included.';
COMMENT ON VIEW sync.noted IS
'The changes waiting for the relay: one row per noted key (a NULL key: the whole table).';
COMMENT ON FUNCTION sync.capture() IS
'The trigger that notes each change of a synced table (and of the replicas relation) for the '
'relay; declaring a table installs it, sync.drop removes it. Not called by hand.';
COMMENT ON FUNCTION sync.note_keys(bytea) IS
'The keys a capture note holds (sync.note.keys), as jsonb, in the order they were noted.';
COMMENT ON FUNCTION sync.note_keys(bytea, integer) IS
'The first most keys a capture note holds (sync.note.keys), as jsonb, in the order they were noted.';

-- The relay (src/relay/)
COMMENT ON FUNCTION sync.pass() IS
'Runs one relay pass in this transaction: takes notes, plans rows and replicas, applies '
'confirmations, moves answers, plans repairs and writes messages. Only on the session that holds the '
'relay lock; returns what it did.';
COMMENT ON PROCEDURE sync.relay() IS
'Runs the relay worker''s loop in this session until cancelled, for hosts that cannot preload '
'magic_sync: takes the relay lock or stands by, runs passes, and retries, audits, prunes, reports '
'and raises alarms on their timers.';
COMMENT ON FUNCTION sync.start_relay() IS
'Starts one more relay worker for this database (it stands by while another holds the relay lock); '
'returns its pid.';
COMMENT ON FUNCTION sync.prune() IS
'Prunes what every replica has: tombstones every member of their scope confirmed, chunks no message '
'uses, filed-upload ids older than magic_sync.upload_memory. The relay runs it every '
'magic_sync.prune_every; returns what it pruned.';
COMMENT ON FUNCTION sync.setting(text) IS
'The value of the setting magic_sync.<name>, read through the library so that it is loaded.';
COMMENT ON VIEW sync.health IS
'The relay at a glance: the notes backlog and its age, the lock holder''s pid, the last pass, what is '
'set aside, and the oldest open transaction holding back the horizon.';
COMMENT ON FUNCTION sync.message(uuid, bigint) IS
'A message of a replica''s outbox, by its seq, assembled exactly as the sender sends it.';

-- The sender's functions (src/relay/outbox.sql), executable by sync_sender
COMMENT ON FUNCTION sync.next(integer, interval) IS
'For the sender: leases the head unsent message of up to n replicas that are live, not backing off '
'and not leased, for lease (and while this session lives), and returns each assembled with its '
'message id and the origin the sender puts in its header (the history it is sent from).';
COMMENT ON FUNCTION sync.next(integer, interval, uuid[], integer, text, boolean) IS
'For the sender: as sync.next(n, lease), among the replicas named (all when among is NULL) that '
'transport delivers (or any sender does), each head returned with up to run - 1 of the messages '
'after it, covered by the head''s lease; by_reference: a rows message as its envelope and the ids '
'of its chunks in order (sync.chunks), not assembled.';
COMMENT ON FUNCTION sync.chunks(bigint[], text) IS
'For the sender: the bodies and withheld notes of the shared chunks named, while this database''s '
'history is origin (as sync.next returned it with their ids), to assemble the rows messages '
'sync.next returned by reference as sync.message does.';
COMMENT ON FUNCTION sync.sent(uuid, bigint) IS
'For the sender: the replica took message seq. Marks it sent (it stays until the replica confirms '
'it) and ends its lease and the replica''s backoff.';
COMMENT ON FUNCTION sync.sent(uuid[], bigint[], text[]) IS
'For the sender: many deliveries recorded at once, as sync.sent(replica, seq) each; returns the '
'replicas whose backoff it ended. origins, when given, are the ones sync.next returned with the '
'messages: a delivery of another history (the sender reconnected after a restore or a failover) '
'is not recorded.';
COMMENT ON FUNCTION sync.failed(uuid, bigint, boolean, text, text) IS
'For the sender: message seq was not taken. Ends its lease, backs the replica off '
'(magic_sync.backoff doubling to magic_sync.backoff_max), keeps error as its last error, and counts '
'a refusal when retry is false; not when origin, given, is not this history (as sync.sent).';
COMMENT ON FUNCTION sync.backlog() IS
'For the sender''s progress line: the unsent messages, the replicas backing off, and how long the '
'oldest unsent message has waited.';
COMMENT ON FUNCTION sync.pull_head(uuid, interval, boolean) IS
'For the pull transport: the replica''s head message, leased to the device that asks for lease (by '
'its time alone, renewed when it asks again), with the origin to put in its header; nothing when '
'there is none or a push sender holds it; an error when another transport delivers the replica. '
'by_reference: a rows message by reference (message NULL), as sync.next gives it, for a gateway '
'that assembles it from sync.chunks.';
COMMENT ON FUNCTION sync.pull_ack(uuid, text) IS
'For the pull transport: the device took message_id. Recorded sent, and true, only when it names the '
'replica''s current head, leased to the pull gateway; anything else takes nothing and returns false.';
COMMENT ON FUNCTION sync.pull_waiting(uuid[]) IS
'For the pull transport, at each wake-up: of the replicas whose devices wait, the live ones with an '
'unsent message (one statement for every waiting device).';
COMMENT ON FUNCTION sync.pull_refused(uuid, text, text) IS
'For the pull transport: the device cannot take message_id. Recorded as a push transport''s refusal '
'(refusals, last error, the alarm), and true, when it names the head; the message stays the head.';

-- Filing uploads (src/filing/), executable by sync_receiver
COMMENT ON FUNCTION sync.receive(uuid, bytea) IS
'Files an upload from the replica the caller authenticated, in the caller''s transaction and as the '
'caller: rows by their table''s rules, what cannot be filed kept with its reason, the answer left for '
'the relay. Returns filed, answered again, kept, dropped, or refused (nothing filed: the replica keeps '
'as much as magic_sync.max_kept_items and max_kept_bytes allow); refused or an ERROR means send the same '
'bytes again later.';
COMMENT ON FUNCTION sync.retry_set_aside() IS
'Tries again, in this transaction, everything set aside that is due: what the relay could not plan '
'or send, and every slice of the kept uploads. Returns what it did, as log lines. While the relay '
'worker runs, asks it instead: it tries everything again once this commits.';
COMMENT ON FUNCTION sync.retry_uploads(integer, interval) IS
'Tries again one slice of the kept uploads that are due (at most slice items or budget of time), '
'each item in its own subtransaction, as the role and under the settings it was kept under. The '
'relay runs one slice per transaction.';

-- Verification (src/verify/)
COMMENT ON FUNCTION sync.expected(uuid) IS
'What the replica must hold, worked out from the declarations and the tables alone: per row its '
'table, key and row in canonical form, h (the version it is sent), its scope, and whether it is '
'withheld. A replica that is not live must hold nothing.';
COMMENT ON FUNCTION sync.audit() IS
'Holds the relay''s state against the tables: every scope''s fingerprint recomputed from them, every '
'live replica''s scopes from the declarations. Returns each disagreement (a bug of the bookkeeping) '
'and plans it again. The relay runs it every magic_sync.audit_every.';
COMMENT ON FUNCTION sync.verify(uuid) IS
'A self-check of one replica''s scopes: each scope''s fingerprint recounted from the relay''s rows '
'against the running one the pass keeps.';
COMMENT ON VIEW sync.status IS
'Per replica: live, generation, outbox depth, how long the oldest message has waited to be sent and '
'to be confirmed, backoff, last error, what is set aside, the rows it lacks and why (withheld as too '
'big, set aside by the pass, not taken by it); its state: in sync (proven by its reports against '
'the server''s fingerprints), catching up (messages unsent), waiting for its report (delivered, not '
'confirmed), failing (deliveries fail, or repairs do not converge), lacking rows, repairing or '
'forgotten (not live), with state_detail, a sentence of its figures and what to do; and how many of '
'its uploads were refused because they would have kept more than magic_sync.max_kept_items or '
'max_kept_bytes allow (sync.upload_refusal says why).';
COMMENT ON TABLE sync.repair IS
'Repairs under way, one row per replica and scope: its phase, the ranges of the key hash asked, '
'the rounds so far and the storm breaker.';

-- Monitoring (src/verify/truth.sql), executable by sync_monitor
COMMENT ON FUNCTION sync.replica_counts() IS
'For monitoring: the replicas counted by what sync.status says of them and by live, with their '
'unsent messages, the oldest unsent, and what is set aside. Reads sync.status once: scrape it every '
'15 s or slower.';
COMMENT ON FUNCTION sync.relay_health() IS
'For monitoring: the notes backlog and its age, whether a relay holds the lock, the time since the '
'last pass, what is set aside by kind, and how long the horizon has been held back.';
COMMENT ON FUNCTION sync.fleet(integer) IS
'The fleet at a glance, one jsonb document (src/verify/fleet.sql), for the sender''s page '
'(magic-sync-sender --metrics: GET / and /fleet.json), executable by sync_sender and sync_monitor: '
'the replicas counted by state, the slowest (at most slowest) with their lag, last error and what '
'their state means, the relay, the alarms, and what is set aside with its fix. Reads sync.status '
'once.';
COMMENT ON VIEW sync.current_delivery IS
'How delivering to each replica goes, as its senders recorded it (sync.delivery): backoff, last error, '
'refusals in a row, for its generation now only (a replica provisioned again starts with none).';
