-- The runs list by latest update (order=updated) without an index on updated_at: a step
-- commit rewrites updated_at at every step, and an index naming it (even a partial one:
-- Postgres compares every indexed and predicate column) would cost each of them its HOT
-- update, a new entry in every index of runs. finished_at is updated_at while the run is
-- terminal, NULL while it is open: computed by the database, so no statement has to keep
-- it, and it changes only when a run finishes (an update that changes status, never HOT
-- anyway) or is changed once finished. A step that goes on leaves it NULL: still HOT.
-- The list merges the finished runs, walked along runs_finished, with the open runs (few;
-- the partial index runs_open), sorted by updated_at (store/listing.py).
-- Adding a stored generated column rewrites runs once, under an exclusive lock.
ALTER TABLE runs ADD COLUMN finished_at DOUBLE PRECISION GENERATED ALWAYS AS (
    CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN updated_at END) STORED;
CREATE INDEX runs_finished ON runs (finished_at, thread_id) WHERE finished_at IS NOT NULL;
