-- tether schema 1 (Postgres). Times are DOUBLE PRECISION seconds since the Unix epoch, read from the
-- database clock. Every table carries thread_id so the schema can be split by thread.
-- Steps and fencing epochs are BIGINT: long-lived actor runs must never wrap them.

CREATE TABLE runs (
    thread_id        TEXT PRIMARY KEY,
    agent            TEXT NOT NULL,
    version          TEXT NOT NULL,
    status           TEXT NOT NULL,           -- queued|running|waiting|sleeping|completed|failed|cancelled
    node             TEXT,                    -- node to run next (NULL once terminal)
    step             BIGINT NOT NULL DEFAULT 0,   -- last committed super-step
    attempt          INTEGER NOT NULL DEFAULT 0,  -- executions of the current step so far
    failures         INTEGER NOT NULL DEFAULT 0,  -- failed attempts of the current step
    input            BYTEA NOT NULL,           -- initial state (the base every replay starts from)
    input_hash       TEXT NOT NULL,
    idempotency_key  TEXT UNIQUE,
    lease_owner      TEXT,
    lease_expires_at DOUBLE PRECISION,
    epoch            BIGINT NOT NULL DEFAULT 0,   -- fencing epoch, bumped on every claim
    wake_at          DOUBLE PRECISION,        -- not claimable before this time
    waiting_for      TEXT,                    -- interrupt|mail|join when status = waiting
    error            BYTEA,                    -- JSON {category, type, message, traceback}
    parent_thread_id TEXT,
    forked_from      TEXT,
    forked_step      BIGINT,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL
) WITH (fillfactor = 80);  -- room on each page for HOT updates: a step commit rewrites the row
-- Only live runs can become claimable, so the claim scan walks this small partial index in
-- claim order (the columns match the claim_runs query) instead of every finished run.
CREATE INDEX runs_claimable ON runs (version, (coalesce(wake_at, created_at)))
    WHERE status IN ('queued', 'sleeping', 'running');
CREATE INDEX runs_lease ON runs (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX runs_created ON runs (created_at, thread_id);
CREATE INDEX runs_parent ON runs (parent_thread_id) WHERE parent_thread_id IS NOT NULL;

-- One row per committed super-step. kind 's' = full snapshot of the state, 'd' = delta
-- ({"s": {key: value}, "a": {key: [appended items]}}) against the previous step.
CREATE TABLE checkpoints (
    thread_id   TEXT NOT NULL,
    step        BIGINT NOT NULL,
    node        TEXT NOT NULL,
    next_node   TEXT,
    kind        TEXT NOT NULL,
    data        BYTEA NOT NULL,
    worker      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    started_at  DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (thread_id, step)
);

-- Recorded results of nondeterministic calls, keyed by (run, step, call index).
CREATE TABLE journal (
    thread_id TEXT NOT NULL,
    step      BIGINT NOT NULL,
    idx       INTEGER NOT NULL,
    name      TEXT NOT NULL,
    result    BYTEA NOT NULL,
    PRIMARY KEY (thread_id, step, idx)
);

-- Human-in-the-loop interrupts: one row per interrupt reached, answered exactly once.
CREATE TABLE interrupts (
    thread_id   TEXT NOT NULL,
    step        BIGINT NOT NULL,
    idx         INTEGER NOT NULL,
    id          TEXT NOT NULL UNIQUE,
    payload     BYTEA NOT NULL,
    value       BYTEA,
    status      TEXT NOT NULL,                -- pending|resolved
    created_at  DOUBLE PRECISION NOT NULL,
    resolved_at DOUBLE PRECISION,
    PRIMARY KEY (thread_id, step, idx)
);
CREATE INDEX interrupts_pending ON interrupts (status, created_at);
-- Answering a run's question finds it by thread_id among pending ones only.
CREATE INDEX interrupts_pending_thread ON interrupts (thread_id) WHERE status = 'pending';

-- Outbox: side effects requested by a step, written in the step's transaction.
CREATE TABLE outbox (
    thread_id        TEXT NOT NULL,
    key              TEXT NOT NULL,
    step             BIGINT NOT NULL,
    idx              BIGINT NOT NULL,             -- a compensation's is -(step * 100000 + idx)
    name             TEXT NOT NULL,
    payload          BYTEA NOT NULL,
    status           TEXT NOT NULL,           -- pending|running|done|dead
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at DOUBLE PRECISION,
    epoch            BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  DOUBLE PRECISION NOT NULL,
    result           BYTEA,
    error            TEXT,
    compensates      TEXT,
    created_at       DOUBLE PRECISION NOT NULL,
    done_at          DOUBLE PRECISION,
    compensable      BOOLEAN NOT NULL DEFAULT false,  -- had a compensate handler when requested
    PRIMARY KEY (thread_id, key)
);
CREATE INDEX outbox_due ON outbox (status, next_attempt_at);

-- Mailboxes, keyed by the recipient's thread_id.
CREATE TABLE mailbox (
    id            BIGSERIAL PRIMARY KEY,
    thread_id     TEXT NOT NULL,
    sender        TEXT,
    message       BYTEA NOT NULL,
    created_at    DOUBLE PRECISION NOT NULL,
    consumed_step BIGINT
);
CREATE INDEX mailbox_pending ON mailbox (thread_id, consumed_step, id);

-- Rainbow deploys: routing weights per version.
CREATE TABLE deployments (
    version    TEXT PRIMARY KEY,
    weight     DOUBLE PRECISION NOT NULL,
    state      TEXT NOT NULL,                 -- active|draining|retired
    updated_at DOUBLE PRECISION NOT NULL
);
