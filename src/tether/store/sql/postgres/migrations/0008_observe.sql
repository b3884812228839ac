-- Observability: the audit log of operator actions, and each run's trace context.

-- One row per operator action (start, resume, cancel, fork, send, route, drain, retire,
-- upgrade, effect.retry, prune), written in the action's own transaction: a row exists only
-- for an action that happened. thread_id is the run acted on (NULL for deployment actions);
-- target what was acted on (a thread_id, a version, an effect key); details a JSON object.
-- Rows outlive the runs they name: retention does not prune the audit log.
CREATE TABLE audit (
    id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        DOUBLE PRECISION NOT NULL,
    actor     TEXT NOT NULL,
    action    TEXT NOT NULL,
    thread_id TEXT,
    target    TEXT,
    details   TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_thread ON audit (thread_id, id) WHERE thread_id IS NOT NULL;
CREATE INDEX audit_action ON audit (action, id);

-- The W3C traceparent of the run's anchor span (tether.observe.tracing), set when the run is
-- created by a process that traces or with a caller's traceparent; NULL: derived from the
-- thread_id. Never changes: every worker that drives the run continues this trace.
ALTER TABLE runs ADD COLUMN trace_context TEXT;
