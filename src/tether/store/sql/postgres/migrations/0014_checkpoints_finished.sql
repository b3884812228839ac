-- The dashboard's charts (/ui/metrics) count and sample the steps finished in the last hour
-- or day: a time range of this index, not a scan of every checkpoint ever written. Steps
-- finish in time order, so each commit appends at the index's right edge.
CREATE INDEX checkpoints_finished ON checkpoints (finished_at);
