-- Every magic_sync.* setting, with its default, unit and range.
SELECT name, setting, unit, min_val, max_val, context
FROM pg_settings WHERE name LIKE 'magic_sync.%' ORDER BY name;

-- Settings are read with their units.
SET magic_sync.idle = '1s';
SHOW magic_sync.idle;
SET magic_sync.bytes_per_message = '64kB';
SHOW magic_sync.bytes_per_message;
RESET magic_sync.idle;
RESET magic_sync.bytes_per_message;

-- Bad values are refused, saying why.
SET magic_sync.rows_per_message = 0;
SET magic_sync.bytes_per_message = 100;
SET magic_sync."window" = -1;  -- WINDOW is an SQL keyword: quote it in SET
SET magic_sync.backoff = 'soon';
SET magic_sync.database = 'other';

-- The prefix is reserved: a misspelled setting is an error, not a silent placeholder.
SET magic_sync.rows_per_mesage = 10;
