-- Effect dispatch without planner statistics (issue 3). A run's head is its first effect in
-- request order (step, idx) that is still pending or running; only heads are claimable. This
-- index holds only those live effects, ordered by run: one descent finds the head of the next
-- run, so claim_effects walks runs in thread_id order at a cost per run visited, whatever the
-- statistics say (autovacuum may be off). Done and dead effects leave it.
CREATE INDEX outbox_live ON outbox (thread_id, step, idx) WHERE status IN ('pending', 'running');

-- The old claim's scan by due time; claim_effects no longer reads it (renew_effect_leases uses
-- outbox_live), and every status change paid for an entry in it.
DROP INDEX outbox_due;
