-- Named queries for the SQLite store. NOW is the database clock in Unix seconds:
-- (julianday('now') - 2440587.5) * 86400.0, constant within one statement.
-- This file: the clock (the schema_version bookkeeping is in sqlite.py).

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;
