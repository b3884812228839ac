-- Effect dispatch without planner statistics (issue 3). A run's head is its first effect in
-- request order (step, idx) that is still pending or running; only heads are claimable. This
-- index holds only those live effects, ordered by run: one descent finds the head of the next
-- run, so claim_effects walks runs in thread_id order at a cost per run visited, whatever the
-- statistics say (autovacuum may be off). Done and dead effects leave it.
CREATE INDEX outbox_live ON outbox (thread_id, step, idx) WHERE status IN ('pending', 'running');

-- The old claim's scan by due time; claim_effects no longer reads it (renew_effect_leases uses
-- outbox_live), and every status change paid for an entry in it.
DROP INDEX outbox_due;

-- Done marks for a batch of effects in one call (complete_effects): one fenced update per
-- effect by its primary key, whatever the statistics say (an UPDATE ... FROM unnest(...)
-- joined the batch to the outbox by a plan chosen on statistics: with none, or with stale
-- ones, it scanned the whole outbox once per batch, or once per effect). Returns the
-- (1-based) positions of the effects marked: those whose epoch was still current.
CREATE FUNCTION tether_complete_effects(thread_ids TEXT[], keys TEXT[], epochs BIGINT[],
                                        results BYTEA[])
RETURNS SETOF INTEGER LANGUAGE plpgsql AS $$
DECLARE
    now_ DOUBLE PRECISION := extract(epoch FROM clock_timestamp())::float8;
BEGIN
    FOR i IN 1 .. coalesce(array_length(thread_ids, 1), 0) LOOP
        UPDATE outbox
        SET status = 'done', result = results[i], error = NULL, lease_owner = NULL,
            lease_expires_at = NULL, done_at = now_
        WHERE thread_id = thread_ids[i] AND key = keys[i] AND epoch = epochs[i]
          AND status = 'running';
        IF FOUND THEN
            RETURN NEXT i;
        END IF;
    END LOOP;
END
$$;
