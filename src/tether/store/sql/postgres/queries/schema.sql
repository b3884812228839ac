-- Postgres: the clock and the schema_version bookkeeping of migrate.py.

-- name: now
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: schema_table
SELECT to_regclass('schema_version') IS NOT NULL;

-- name: schema_applied
SELECT coalesce(max(version), 0) FROM schema_version;

-- name: create_schema_version
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
);

-- name: migrate_lock
-- Held until the migrating transaction ends: concurrent migrators apply migrations one at a time.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: record_migration
INSERT INTO schema_version (version, name, applied_at)
VALUES (%(version)s, %(name)s, extract(epoch FROM clock_timestamp())::float8);
