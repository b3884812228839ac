-- Effect dispatch (issue 3). A run's head is its first effect in request order (step, idx)
-- that is still pending or running; only heads are claimable. This index holds only those
-- live effects, ordered by run: claim_effects checks that an effect is its run's head with
-- one probe of it, whatever the statistics say, and done effects leave it.
CREATE INDEX outbox_live ON outbox (thread_id, step, idx) WHERE status IN ('pending', 'running');

-- The old claim's scan by due time; nothing reads it now (renew_effect_leases reads
-- outbox_live), and every status change paid for an entry in it.
DROP INDEX outbox_due;
