-- LangGraph checkpoints (tether.langgraph.TetherSaver), beside tether's own runs. Every key
-- starts with thread_id, as every other table's, so the tables distribute by thread_id.
-- lg_checkpoints: one row per LangGraph checkpoint; `checkpoint` is the checkpoint without its
-- channel values or id, serialized by the saver's serde (`type` names the format); run_id is
-- metadata.run_id, kept apart for delete_for_runs.
CREATE TABLE lg_checkpoints (
    thread_id            TEXT NOT NULL,
    checkpoint_ns        TEXT NOT NULL,
    checkpoint_id        TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    run_id               TEXT,
    type                 TEXT NOT NULL,
    checkpoint           BYTEA NOT NULL,
    metadata             JSONB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX lg_checkpoints_run ON lg_checkpoints (run_id) WHERE run_id IS NOT NULL;
-- lg_blobs: one row per channel version, written once, shared by every checkpoint that holds
-- that version. A row with base_version is a delta: a msgpack array of the items appended to
-- the value at base_version (same thread, namespace and channel).
CREATE TABLE lg_blobs (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel       TEXT NOT NULL,
    version       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BYTEA,
    base_version  TEXT,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);
-- lg_writes: a task's pending writes against a checkpoint, one row per (task_id, idx).
CREATE TABLE lg_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    idx           INTEGER NOT NULL,
    channel       TEXT NOT NULL,
    type          TEXT NOT NULL,
    blob          BYTEA,
    task_path     TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
