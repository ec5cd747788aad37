-- magic_sync 0.2.0: the schema `sync` (docs/DESIGN.md §3), its roles and privileges.
\echo Use "CREATE EXTENSION magic_sync" to load this file. \quit

-- Rows travel as UTF-8 JSON, and uploads are filed from it: a database of another encoding would
-- store what it cannot represent converted, or mangled.
DO $encoding$
BEGIN
    IF current_setting('server_encoding') <> 'UTF8' THEN
        RAISE EXCEPTION 'magic_sync needs a UTF8 database: database "%" is %', current_database(),
                        current_setting('server_encoding')
            USING HINT = 'Create the database with ENCODING ''UTF8'' (CREATE DATABASE ... '
                         'ENCODING ''UTF8'' TEMPLATE template0) and install magic_sync there.';
    END IF;
END
$encoding$;

-- The routines a user calls live in `sync`, each with its comment (src/state/comments.sql); the
-- ones that only the engine calls live in `sync_internal`, which no role but the extension's
-- owner may use. The state's tables and views are in `sync`.
CREATE SCHEMA sync_internal;

-- Roles for the processes that talk to the engine from outside (the sender, the up route, a
-- monitoring agent). Cluster-wide, so created only when absent and never dropped with the
-- extension.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sync_sender') THEN
        CREATE ROLE sync_sender NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sync_receiver') THEN
        CREATE ROLE sync_receiver NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sync_monitor') THEN
        CREATE ROLE sync_monitor NOLOGIN;
    END IF;
END
$roles$;

-- Declarations ----------------------------------------------------------------------------------

-- Which relation lists the replicas (one set per database).
CREATE TABLE sync.replica_set (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    relation regclass NOT NULL,
    relation_name text NOT NULL,
    name text NOT NULL,
    live text NOT NULL DEFAULT 'true',
    partitioned_by name,
    -- The column whose value names the transport that delivers each replica (NULL: any sender
    -- delivers every replica).
    transport name
);

-- One codec per synced table: how its rows travel.
CREATE TABLE sync.codec (
    id serial PRIMARY KEY,
    relation regclass NOT NULL UNIQUE,
    table_name text NOT NULL UNIQUE,
    kind text NOT NULL CHECK (kind IN ('catalog', 'record', 'both')),
    -- The rule as declared ("to"), and as parsed once, at declaration, into who receives a row:
    -- nobody, all (of the partition), own (the replica whose id the row's to_column holds) or
    -- group (every replica whose replica_column equals the row's to_column). Every audience and
    -- membership is derived from these columns (sync.audience_sql, the pass), never from "to".
    "to" text,
    audience text NOT NULL CHECK (audience IN ('nobody', 'all', 'own', 'group')),
    to_column name CHECK ((to_column IS NOT NULL) = (audience IN ('own', 'group'))),
    replica_column name CHECK ((replica_column IS NOT NULL) = (audience = 'group')),
    columns name[],
    replica_columns name[] NOT NULL DEFAULT '{}',
    stamp name[] NOT NULL DEFAULT '{}',
    key_columns name[] NOT NULL,
    -- The key columns' types when declared: a change of them changes every row's key.
    key_types regtype[] NOT NULL,
    -- And what ALTER TYPE may change of them (sync_internal.key_definitions): an enum's value
    -- renamed changes the keys that hold it. NULL: not known (a codec from 0.1.0, until declared
    -- again).
    key_definitions text,
    -- The table's columns and their types when declared or last planned whole (sync_internal.table_shape):
    -- a schema change that alters them plans the table again.
    shape text NOT NULL DEFAULT ''
);

-- What the server knows of a replica that sends something up, and how a filing is set up.
CREATE TABLE sync.sender_rule (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    known regprocedure,
    filing regprocedure
);

-- Capture ---------------------------------------------------------------------------------------

-- What changed, for the pass to look at again. The capture trigger writes one note per table and
-- transaction, just before it commits, holding the keys of the rows it changed (`keys`, `key_count` of them, read with
-- sync.note_keys(keys); the format is src/capture/note_keys.hpp's); SQL that notes one key
-- writes it in `key`; a note with neither means every row of the codec (a TRUNCATE, a
-- declaration). Codec 0 is the replicas relation.
-- No index, on purpose: the capture inserts into the heap directly (src/capture/trigger.cpp),
-- and the pass reads the whole (short) queue by seq anyway.
CREATE TABLE sync.note (
    seq bigserial NOT NULL,
    codec int NOT NULL,
    key jsonb,
    keys bytea,
    key_count int NOT NULL DEFAULT 1,
    noted_at timestamptz NOT NULL DEFAULT now()
);
-- The keys' bytes are the columns' own values and compress little: not worth pglz on every
-- statement.
ALTER TABLE sync.note ALTER COLUMN keys SET STORAGE EXTERNAL;

-- Relay state -----------------------------------------------------------------------------------

-- An audience: ('*', '') for all, ('id', <uuid>), ('store_id', '42'), each within a partition.
CREATE TABLE sync.scope (
    id bigserial PRIMARY KEY,
    match text NOT NULL,
    value text NOT NULL,
    partition text NOT NULL DEFAULT '',
    head bigint NOT NULL DEFAULT 0,
    fp bytea NOT NULL DEFAULT '\x0000000000000000000000000000000000000000000000000000000000000000',
    n bigint NOT NULL DEFAULT 0,
    UNIQUE (match, value, partition)
);

-- Where each synced row lives and its version; `gone` marks a tombstone.
-- `k` is the key hash, `hash` the version v = SHA-256 of `body`, the canonical JSON of the
-- travelling columns (NULL for a tombstone). Keyed by `k`, which names codec and key at once:
-- its 32 bytes compare as one memcmp where `(codec, key)` compared jsonb, and the key's one index
-- also finds a row's live version (at most one per k is not gone), so a change writes two index
-- entries, not three.
CREATE TABLE sync.row (
    codec int NOT NULL,
    key jsonb NOT NULL,
    k bytea NOT NULL,
    -- No foreign key: the pass creates every scope it files rows in, and a check per row would
    -- cost more than the insert.
    scope bigint NOT NULL,
    seq bigint NOT NULL,
    hash bytea,
    body text,
    gone boolean NOT NULL DEFAULT false,
    -- Too big for any message (sync_internal.row_travels): sent as a withheld note, and outside the
    -- scope's fingerprint on both sides, so repair never chases it.
    withheld boolean NOT NULL DEFAULT false,
    -- A version filed from this replica's upload that it holds already (sync.echo), and the seq
    -- of the version it replaced: not sent back to it while it is the scope's only member and
    -- was sent that older version.
    echo_of uuid,
    echo_prev bigint,
    PRIMARY KEY (k, scope)
);
CREATE INDEX row_scope_seq ON sync.row (scope, seq);
-- The rows withheld, by scope: what sync.status counts as lacked, without reading the others.
CREATE INDEX row_withheld ON sync.row (scope) WHERE withheld AND NOT gone;

-- Codecs that ended (sync.drop, a dropped table, a declaration under another name or key): the
-- next pass forgets their rows and tells every replica that held some to drop their table.
CREATE TABLE sync.dropped_codec (
    codec int PRIMARY KEY,
    table_name text NOT NULL,
    dropped_at timestamptz NOT NULL DEFAULT now()
);

-- Seqs of rows: drawn only by the relay's lock holder, so seq order is commit order.
CREATE SEQUENCE sync.row_seq;

CREATE TABLE sync.replica (
    id uuid PRIMARY KEY,
    gen int NOT NULL DEFAULT 1,
    live boolean NOT NULL DEFAULT true,
    partition text NOT NULL DEFAULT '',
    provisioned_at timestamptz NOT NULL DEFAULT now(),
    next_seq bigint NOT NULL DEFAULT 1,
    -- What the next rows message must carry: a full reset, scopes left.
    reset_pending boolean NOT NULL DEFAULT true,
    pending_drops text[] NOT NULL DEFAULT '{}',
    -- Tables whose rows the next rows message drops (sync.dropped_codec).
    pending_table_drops text[] NOT NULL DEFAULT '{}',
    applied bigint NOT NULL DEFAULT 0,
    -- Provisioned by a relay state that a restore made: the device may hold what was dumped, so
    -- it is sent no rows but where it stands, once that state planned its tables, and proves
    -- what it holds (sync_internal.pass_prove_holdings).
    proving boolean NOT NULL DEFAULT false,
    -- The transport that delivers it (sync.replica_set.transport): only a sender of that
    -- transport leases its messages. NULL: any sender's (no transport column is declared); ''
    -- when its row names none: no sender's.
    transport text
);
-- Replicas whose next message must carry a reset or a drop.
CREATE INDEX replica_pending ON sync.replica (id)
WHERE reset_pending OR cardinality(pending_drops) > 0 OR cardinality(pending_table_drops) > 0;
-- How many replicas have drops pending, for the planner: without them it takes a third of the
-- replicas to have some (its guess for any `cardinality(..) > 0`), and reads every replica where
-- replica_pending finds the few (next_due and the pass's messages of drops alone, at every pass:
-- 17 ms at 10,000 replicas).
CREATE STATISTICS sync.replica_scope_drops ON (cardinality(pending_drops)) FROM sync.replica;
CREATE STATISTICS sync.replica_table_drops ON (cardinality(pending_table_drops)) FROM sync.replica;

-- A replica's cursor in each of its scopes: sent through, and confirmed through.
CREATE TABLE sync.member (
    replica uuid NOT NULL REFERENCES sync.replica ON DELETE CASCADE,
    scope bigint NOT NULL REFERENCES sync.scope,
    sent bigint NOT NULL DEFAULT 0,
    confirmed bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (replica, scope)
);
-- The members behind their scope's head, found without reading the others.
CREATE INDEX member_behind ON sync.member (scope, sent);

-- An encoded run of one scope's rows, shared by every replica that needs the same run.
CREATE TABLE sync.chunk (
    id bigserial PRIMARY KEY,
    scope bigint NOT NULL REFERENCES sync.scope,
    from_seq bigint NOT NULL,
    to_seq bigint NOT NULL,
    -- The scope's head when it was built: reused only while the scope has not changed, so a
    -- replica never gets a version of a row that a later one replaced.
    built_head bigint NOT NULL,
    rows int NOT NULL,
    bytes int NOT NULL,
    body text NOT NULL,
    -- Rows of the run too big for any message: [{"t":..,"k":{..},"why":".."}].
    withheld jsonb NOT NULL DEFAULT '[]',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chunk_start ON sync.chunk (scope, from_seq);
-- A chunk's body is a message's worth of rows, written once and read by every sender that sends
-- it: compressed with lz4 where the server has it (pglz took a seventh of an outbox pass).
DO $lz4$
BEGIN
    ALTER TABLE sync.chunk ALTER COLUMN body SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END
$lz4$;

-- Per replica, in order: the messages to send. `seq` is the replica's own message counter.
CREATE TABLE sync.outbox (
    replica uuid NOT NULL REFERENCES sync.replica ON DELETE CASCADE,
    seq bigint NOT NULL,
    gen int NOT NULL,
    kind text NOT NULL,
    chunks bigint[] NOT NULL DEFAULT '{}',
    reset text[] NOT NULL DEFAULT '{}',
    drops text[] NOT NULL DEFAULT '{}',
    table_drops text[] NOT NULL DEFAULT '{}',
    body bytea,
    advances jsonb,
    upload uuid,  -- a filed answer's upload: one answer of an upload waits at a time
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at timestamptz,
    tries int NOT NULL DEFAULT 0,
    -- A lease (sync.next) holds until lease_until and while the session that took it lives: that
    -- session's pid and start (pg_stat_activity.backend_start; a later session may get the pid).
    lease_until timestamptz,
    lease_pid int,
    lease_backend_start timestamptz,
    PRIMARY KEY (replica, seq)
);

-- How delivering to a replica goes, as its senders record it (sync.failed, sync.sent): its
-- backoff, its last error, its refusals in a row. Of generation `gen` only: a replica provisioned
-- again starts with none. The senders' alone, apart from sync.replica, which the relay's pass
-- locks: a sender never waits for a pass (docs/DESIGN.md §5, the order of locks).
CREATE TABLE sync.delivery (
    replica uuid PRIMARY KEY REFERENCES sync.replica ON DELETE CASCADE,
    gen int NOT NULL,
    backoff interval,
    backoff_until timestamptz,
    last_error text,
    refusals int NOT NULL DEFAULT 0,
    -- In a backoff after a transient failure: when its head may go early, as a probe of whether
    -- its line answers again (magic_sync.probe_every). NULL: no probe (a refusal: the line
    -- answers, the device said no).
    probe_at timestamptz
);
-- The delivery rows that count: of each replica's generation now. Every reader goes through it
-- (in schema sync with the tables, so that a relay role granted them may read it).
CREATE VIEW sync.current_delivery AS
SELECT d.* FROM sync.delivery d JOIN sync.replica r ON r.id = d.replica AND r.gen = d.gen;

-- What could not be planned, sent or filed: kept, and tried again.
CREATE TABLE sync.set_aside (
    id bigserial PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('note', 'row', 'upload', 'untaken')),
    replica uuid,
    codec int,
    key jsonb,
    body bytea,
    reason text NOT NULL,
    first_at timestamptz NOT NULL DEFAULT now(),
    tries int NOT NULL DEFAULT 1,
    last_try_at timestamptz NOT NULL DEFAULT now(),
    -- An upload's: the role whose sync.receive kept it (sync_internal.filer). The retry files it again as
    -- that role, so what the route's privileges and row policies refused stays refused.
    filed_as name,
    -- An upload's, too: the id it came under (NULL: a message whose id could not be read), the
    -- table its row names on the wire (NULL: the message kept whole), and the settings the route
    -- filed under (sync_internal.filing_settings), which the retry files it under again.
    upload uuid,
    table_name text,
    settings jsonb,
    -- When an upload is tried again (src/filing/set_aside.sql): once next_try_at has passed (a failure
    -- that data may cure, backed off), or, when it is NULL, only once something filing depends on
    -- has changed since the change it was last tried under (sync.filing_change).
    next_try_at timestamptz,
    change_seen bigint,
    -- An upload that data may cure: the writes counted to the tables its table references when it
    -- was last tried (sync_internal.writes_referenced). Once they move it is due within seconds,
    -- whatever its backoff: the row it waits for may have come.
    data_seen bigint
);
-- A note or row set aside again is counted, not repeated.
CREATE UNIQUE INDEX set_aside_once ON sync.set_aside (kind, codec, key) WHERE kind IN ('note', 'row');
-- A row a replica could not take, reported again, is counted, not repeated.
CREATE UNIQUE INDEX set_aside_untaken_once ON sync.set_aside (replica, codec, key)
WHERE kind = 'untaken';
-- The kept uploads due for a retry, found without reading the others; and an upload's kept rows.
CREATE INDEX set_aside_upload_due ON sync.set_aside (next_try_at) WHERE kind = 'upload';
CREATE INDEX set_aside_upload_change ON sync.set_aside (change_seen) WHERE kind = 'upload';
CREATE INDEX set_aside_upload_of ON sync.set_aside (replica, upload) WHERE kind = 'upload';

-- Uploads refused because they would have kept more than their replica may keep
-- (sync_internal.kept_room): how many, and the last one's time and reason, for the operator
-- (sync.status). One row per replica that had one.
CREATE TABLE sync.upload_refusal (
    replica uuid PRIMARY KEY,
    refused bigint NOT NULL DEFAULT 1,
    last_at timestamptz NOT NULL DEFAULT now(),
    why text NOT NULL
);

-- Uploads filed, so one sent again is answered, not filed twice.
CREATE TABLE sync.upload (
    replica uuid NOT NULL,
    id uuid NOT NULL,
    filed_at timestamptz NOT NULL DEFAULT now(),
    -- The answer given last, so an upload sent again is answered the same.
    kept jsonb NOT NULL DEFAULT '[]',
    -- The retry filed rows of it that it kept: answered again once none of its rows is due.
    refiled boolean NOT NULL DEFAULT false,
    PRIMARY KEY (replica, id)
);
CREATE INDEX upload_refiled ON sync.upload (replica, id) WHERE refiled;

-- What sync.receive() leaves for the relay: it never touches relay state itself, so a long
-- filing transaction never holds a lock the pass needs. The pass moves answers into the outbox
-- (under the lock, so a replica's message seqs are in commit order) and applies confirmations.
CREATE TABLE sync.answer (
    id bigserial PRIMARY KEY,
    replica uuid NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sync.confirmation (
    id bigserial PRIMARY KEY,
    replica uuid NOT NULL,
    applied bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- `both` rows a replica uploaded and that were filed: the pass that plans the row compares the
-- version it makes with the row the replica holds once it takes the answer (the row it had, with
-- the upload over it), and when they are the same does not send that row back to a replica that
-- is its scope's only member (docs/DESIGN.md §6). Taken by that pass.
CREATE TABLE sync.echo (
    id bigserial PRIMARY KEY,
    replica uuid NOT NULL,
    upload uuid NOT NULL,
    codec int NOT NULL,
    key jsonb NOT NULL,
    body jsonb NOT NULL
);
CREATE INDEX echo_row ON sync.echo (codec, key);

-- What a replica last said it holds, per scope (its `holds`), for verification. applied: the
-- last message it had applied when it said so; a report older than the one kept (an upload sent
-- again as it was stored) is not taken.
CREATE TABLE sync.holding (
    replica uuid NOT NULL,
    scope text NOT NULL,
    through bigint NOT NULL,
    fp bytea NOT NULL,
    n bigint NOT NULL,
    ranges jsonb,
    reported_at timestamptz NOT NULL DEFAULT now(),
    applied bigint NOT NULL DEFAULT 0,
    -- The report matched its scope when it was written (sync_internal.report_settled): no repair
    -- begins from it, and the pass's look for repairs passes it over, until the replica reports
    -- again or the scope's fingerprint is counted again.
    settled boolean NOT NULL DEFAULT false,
    PRIMARY KEY (replica, scope)
);
-- The reports a repair may begin from: the pass looks at these, not at every replica's.
CREATE INDEX holding_unsettled ON sync.holding (replica) WHERE NOT settled;

-- Scopes a replica said it holds that it is not a member of: rows it keeps of a history that is
-- gone (a database recovered to a point before it joined them), or a report that crossed the
-- message dropping them. The pass tells it to drop them (sync_internal.pass_drop_foreign_holdings).
CREATE TABLE sync.foreign_holding (
    replica uuid NOT NULL,
    scope text NOT NULL,
    PRIMARY KEY (replica, scope)
);

-- The relay's own bookkeeping: its last pass, for sync.health.
CREATE TABLE sync.relay_state (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_pass_at timestamptz,
    last_pass jsonb,
    replicas_scanned_at timestamptz,
    audited_at timestamptz,
    -- The magic_sync.bytes_per_message the rows' withheld flags were worked out under.
    bytes_per_message int,
    -- Made with the relay state, which pg_dump leaves out: a restore or a re-created extension
    -- makes another, and the messages say so (sync_internal.origin).
    origin uuid NOT NULL DEFAULT gen_random_uuid(),
    -- Whether the pass noted every declaration whole since this state was made: a restore brings
    -- the declarations back without the relay's rows (sync_internal.pass_note_declarations_once).
    declarations_noted boolean NOT NULL DEFAULT false,
    -- The cluster's history (sync_internal.history) at the last pass: another one under the same
    -- state is a promoted standby or a point-in-time recovery (sync_internal.pass_prove_holdings).
    history text,
    -- Set while a relay state made by a restore plans the declared tables for the first time:
    -- the last seq of those whole-table notes. Replicas provisioned meanwhile prove what they hold.
    proving_through bigint
);
INSERT INTO sync.relay_state DEFAULT VALUES;

-- Declarations survive pg_dump; the state is rebuilt by provisioning. What replicas sent and
-- nothing else holds survives too: the uploads kept (they are filed again after a restore) and the
-- uploads filed (one sent again after a restore is answered, not filed twice).
SELECT pg_catalog.pg_extension_config_dump('sync.replica_set', '');
SELECT pg_catalog.pg_extension_config_dump('sync.codec', '');
SELECT pg_catalog.pg_extension_config_dump('sync.codec_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('sync.sender_rule', '');
SELECT pg_catalog.pg_extension_config_dump('sync.set_aside', 'WHERE kind = ''upload''');
SELECT pg_catalog.pg_extension_config_dump('sync.set_aside_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('sync.upload', '');

-- The origins of the relay states this database's declarations lived under, kept by pg_dump (the
-- rows are the relay's, never the install script's): a relay state that finds some it was not
-- made under is a restore's, whose devices may hold what was dumped.
CREATE TABLE sync.lineage (
    origin uuid PRIMARY KEY,
    noted_at timestamptz NOT NULL DEFAULT now()
);
SELECT pg_catalog.pg_extension_config_dump('sync.lineage', '');
