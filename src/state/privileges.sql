-- Privileges (last, so they cover everything above) ----------------------------------------------

-- Nothing for PUBLIC; the sender and receiver roles are granted their functions one by one.
REVOKE ALL ON ALL TABLES IN SCHEMA sync FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA sync FROM PUBLIC;
REVOKE ALL ON SCHEMA sync FROM PUBLIC;
GRANT USAGE ON SCHEMA sync TO sync_sender, sync_receiver, sync_monitor;
REVOKE ALL ON ALL ROUTINES IN SCHEMA sync FROM PUBLIC;
REVOKE ALL ON SCHEMA sync_internal FROM PUBLIC;
REVOKE ALL ON ALL ROUTINES IN SCHEMA sync_internal FROM PUBLIC;
