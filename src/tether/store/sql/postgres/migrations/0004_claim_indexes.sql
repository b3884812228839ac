-- Claims without a visit to every running run. runs_claimable held every live run, 'running'
-- ones included (an expired lease is claimable), so a claim that found nothing to take read
-- each running run's row to check its lease: 5-9 ms at 10,000 running runs, and a worker
-- claims whenever one of its runs ends. Two partial indexes instead, each read as a range:
-- runs due now (queued, or sleeping until a time now past) in due order, and running runs by
-- lease expiry. A claim that finds nothing is two index descents.
DROP INDEX runs_claimable;
CREATE INDEX runs_due ON runs (version, (coalesce(wake_at, created_at)))
    WHERE status IN ('queued', 'sleeping');
CREATE INDEX runs_expiry ON runs (version, lease_expires_at) WHERE status = 'running';
