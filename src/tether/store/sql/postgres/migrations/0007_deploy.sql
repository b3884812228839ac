-- Rainbow deploys: the routing weights per version, the worker registry, and an index of the
-- open runs by version (deploy status, stranding, drain progress, retire's check, upgrade).

-- The deployments table of 0001 was never written; weights are non-negative integers now,
-- and retirement is a time (the state active/draining/drained is derived from the weight and
-- the open runs, never stored).
DROP TABLE deployments;
CREATE TABLE deployments (
    version    TEXT PRIMARY KEY,
    weight     BIGINT NOT NULL CHECK (weight >= 0),
    retired_at DOUBLE PRECISION,
    updated_at DOUBLE PRECISION NOT NULL
);

-- One row per worker process, upserted by its heartbeat. A clean stop stamps stopped_at (the
-- row stays a day, so the time a version was last served is known); a killed worker's row
-- simply stops being renewed and it is dead once last_seen + lease_ttl has passed.
CREATE TABLE workers (
    id          TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         BIGINT NOT NULL,
    version     TEXT NOT NULL,
    agents      TEXT NOT NULL,                -- JSON {agent: [node names, the start node first]}
    concurrency INTEGER NOT NULL,
    busy        INTEGER NOT NULL,
    lease_ttl   DOUBLE PRECISION NOT NULL,
    started_at  DOUBLE PRECISION NOT NULL,
    last_seen   DOUBLE PRECISION NOT NULL,
    stopped_at  DOUBLE PRECISION
);

-- Open runs by version and status, oldest first: counted without reading a row. Its columns
-- change only when a run opens, changes status or finishes (never at a step that goes on).
CREATE INDEX runs_open ON runs (version, status, created_at)
    WHERE status IN ('queued', 'running', 'waiting', 'sleeping');
