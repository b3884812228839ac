-- The runs list by latest update (order=updated) without an index on updated_at, which a
-- step commit rewrites at every step (an entry moved in that index per step). finished_at is
-- updated_at while the run is terminal, NULL while it is open, and its partial index holds
-- the finished runs only. The list merges the finished runs, walked along runs_finished,
-- with the open runs (few; the partial index runs_open), sorted by updated_at
-- (store/listing.py).
-- Kept by triggers on status, not computed (a virtual column of status and updated_at made
-- every step's UPDATE, which sets updated_at, evaluate runs_finished: 2.1x the time of
-- advance_run, measured): a step that goes on sets no status, so neither the triggers nor
-- the index are touched. Exact because every statement that sets updated_at on a run
-- either sets its status or only updates open runs (status = 'running', or the open
-- statuses); a finished run's updated_at never moves without its status being set.
ALTER TABLE runs ADD COLUMN finished_at REAL;
UPDATE runs SET finished_at = updated_at WHERE status IN ('completed', 'failed', 'cancelled');
CREATE INDEX runs_finished ON runs (finished_at, thread_id) WHERE finished_at IS NOT NULL;
CREATE TRIGGER runs_finished_status AFTER UPDATE OF status ON runs
WHEN NEW.finished_at IS NOT (CASE WHEN NEW.status IN ('completed', 'failed', 'cancelled')
                                  THEN NEW.updated_at END)
BEGIN
    UPDATE runs SET finished_at = CASE WHEN NEW.status IN ('completed', 'failed', 'cancelled')
                                       THEN NEW.updated_at END
    WHERE rowid = NEW.rowid;
END;
CREATE TRIGGER runs_finished_insert AFTER INSERT ON runs
WHEN NEW.status IN ('completed', 'failed', 'cancelled')
BEGIN
    UPDATE runs SET finished_at = NEW.updated_at WHERE rowid = NEW.rowid;
END;
