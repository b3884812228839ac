-- Retention (tether prune). A pruned run leaves a tombstone: GET /runs/{id} answers 410 and
-- runtime.get raises RunPruned; a new run may take the thread_id again and never sees the old
-- rows, which were deleted in the transaction that wrote the tombstone.
CREATE TABLE tombstones (
    thread_id   TEXT PRIMARY KEY,
    agent       TEXT NOT NULL,
    status      TEXT NOT NULL,                 -- the run's terminal status
    finished_at REAL NOT NULL,
    pruned_at   REAL NOT NULL
);
-- Maintenance that must run in one process at a time (the pruner): a lease per name, taken
-- while free or expired, renewed as the work goes on; a killed holder's lease expires.
CREATE TABLE maintenance_locks (
    name       TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at REAL NOT NULL
);
