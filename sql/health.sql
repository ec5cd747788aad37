-- sync.health shows the transaction horizon: a session left in an open transaction holding an
-- xid (here through dblink, a second session) is named with its pid and how many transactions
-- and seconds it holds the horizon back; when it ends, it is no longer named.
CREATE DATABASE health_test;
\c health_test
CREATE EXTENSION magic_sync;
CREATE EXTENSION dblink;
-- An older transaction with an xid in another database: every snapshot taken from now on, this
-- session's too, has its xid as xmin. The session asking is never the one named.
SELECT dblink_connect('elsewhere', format('host=%s port=%s dbname=regression',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port')));
SELECT dblink_exec('elsewhere', 'BEGIN');
SELECT xid > 0 AS elsewhere_has_xid FROM dblink('elsewhere', 'SELECT txid_current()') AS t(xid bigint);
SELECT dblink_connect('holder', format('host=%s port=%s dbname=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'),
    current_database()));
SELECT dblink_exec('holder', 'BEGIN');
SELECT xid > 0 AS holder_has_xid FROM dblink('holder', 'SELECT txid_current()') AS t(xid bigint);
SELECT pid AS holder_pid FROM dblink('holder', 'SELECT pg_backend_pid()') AS t(pid int) \gset
-- Three more transactions with an xid each, committed after the holder's began.
SELECT txid_current() > 0 AS consumed;
SELECT txid_current() > 0 AS consumed;
SELECT txid_current() > 0 AS consumed;
SELECT pg_sleep(0.2);
SELECT horizon_held_by, horizon_pid = :holder_pid AS holder_named,
       horizon_xmin_age >= 3 AS three_transactions_old, horizon_seconds >= 0.2 AS open_for_a_while
FROM sync.health;
-- A prepared transaction is not among this database's (max_prepared_transactions is 0 here),
-- and no slot holds the horizon.
SELECT count(*) AS prepared FROM pg_prepared_xacts;
SELECT count(*) AS slots_with_xmin FROM pg_replication_slots WHERE xmin IS NOT NULL;
-- The holder commits: the horizon moves on (held now, if at all, by another session).
SELECT dblink_exec('holder', 'COMMIT');
SELECT horizon_pid IS DISTINCT FROM :holder_pid AS holder_gone FROM sync.health;
SELECT dblink_disconnect('holder');
SELECT dblink_exec('elsewhere', 'COMMIT');
SELECT dblink_disconnect('elsewhere');
-- The view's columns, for exporters.
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'sync.health'::regclass AND attnum > 0 ORDER BY attnum;
\c regression
DROP DATABASE health_test;
