-- The runs list bounded at any size for the filters the dashboard offers (issue 35): each
-- of these reads a page of an index range, not runs_created until enough runs match.
-- Only columns written once (agent, version, created_at at creation; status 'completed' at
-- the end) or kept by the database (idle_at): a step that goes on changes none of them, so
-- its update stays HOT and none of these indexes is touched by it.
-- An agent's runs, or a version's, in created order (the other in each key: one version of
-- an agent, or one agent of a version, is checked in the index).
CREATE INDEX runs_agent ON runs (agent, created_at, thread_id, version);
CREATE INDEX runs_version ON runs (version, created_at, thread_id, agent);
-- The completed runs in created order, as runs_failed and runs_cancelled (0011): when the
-- newest runs are parked, a filter on completed no longer walks them all.
CREATE INDEX runs_completed ON runs (created_at, thread_id, version) WHERE status = 'completed';
-- The latest updated (order=updated) without reading every open run: idle_at is updated_at
-- while the run is queued, waiting or sleeping (it does not move while it rests), NULL while
-- it runs or once finished, computed by the database as finished_at is (0012). A running
-- run's idle_at stays NULL at every step. The list merges the running runs (runs_open, per
-- version: at most what workers lease), the resting ones per status down runs_idle and the
-- finished ones down runs_finished. Adding it rewrites runs once, under an exclusive lock.
ALTER TABLE runs ADD COLUMN idle_at DOUBLE PRECISION GENERATED ALWAYS AS (
    CASE WHEN status IN ('queued', 'waiting', 'sleeping') THEN updated_at END) STORED;
CREATE INDEX runs_idle ON runs (status, idle_at, thread_id) WHERE idle_at IS NOT NULL;
-- Dead effects by age: their count and the dashboard's list read these (an effect dies
-- once), not every done effect.
CREATE INDEX outbox_dead ON outbox (created_at, thread_id, step, idx) WHERE status = 'dead';
