-- idle_at (0017) and finished_at (0012) are set by the statements that change a run's status
-- (the `resting` fragment of the queries), no longer by triggers. A trigger on runs cost
-- every UPDATE of a status a second pass even when its WHEN was false: an interrupt's answer
-- woke its run in 21-25 us with them and 14 us without; W5 at 10,000 runs used 10% less CPU.
-- Workers of a tether release before this migration still run on this schema, but the runs
-- whose status they change keep the old values of both columns (order=updated lists and the
-- dashboard's charts place them by their last change under the new release); see
-- docs/howto-deploy.md. The rows as they are now are made exact here.
DROP TRIGGER runs_finished_status;
DROP TRIGGER runs_finished_insert;
DROP TRIGGER runs_idle_status;
DROP TRIGGER runs_idle_insert;
UPDATE runs
SET finished_at = CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN updated_at END
WHERE finished_at IS NOT (CASE WHEN status IN ('completed', 'failed', 'cancelled')
                               THEN updated_at END);
UPDATE runs
SET idle_at = CASE WHEN status IN ('queued', 'waiting', 'sleeping') THEN updated_at END
WHERE idle_at IS NOT (CASE WHEN status IN ('queued', 'waiting', 'sleeping') THEN updated_at END);
