-- The runs list filtered by a rare terminal status (failed, cancelled) walks only the runs
-- with that status, newest or oldest first: a filter that matches nothing (failed on a version
-- that never failed) reads those runs, not every run. Partial indexes, so only a run that
-- fails or is cancelled writes an entry, and no other query can take them: an index led by
-- status (status, created_at, thread_id) was tried and dropped, as SQLite (no statistics)
-- then walked every running run in each group commit's `status = 'running'` update.
-- The version is in the key too: a listing of one version checks it in the index, reading
-- no row of another version.
CREATE INDEX runs_failed ON runs (created_at, thread_id, version) WHERE status = 'failed';
CREATE INDEX runs_cancelled ON runs (created_at, thread_id, version)
    WHERE status = 'cancelled';
