-- The runs' listing keys in a table of their own, written once per run (issue 35, goal 6).
-- Every change of a run's status (claimed, parked, answered, woken, finished) writes a new
-- version of its row that is not HOT (status is in the partial indexes' predicates), and so
-- an entry in every index of runs whose predicate the new version meets: runs_created,
-- runs_agent and runs_version (0001, 0017) took one on every change, although their columns
-- (created_at, agent, version) never change but for a version move. They are run_keys' now,
-- one row per run, which the listings, the prune's walk, the charts' sample of started runs
-- and `advise --measure` read, joining runs by primary key.
-- The database keeps run_keys in step with runs, whatever writes runs (tether's statements,
-- a bulk load, a script): a statement's inserted runs are added and its deleted runs removed
-- at the end of the statement (statement triggers: one call per statement, its rows as a
-- transition table), a run moved to another version is moved here too (a row trigger that
-- only an UPDATE naming one of the four columns fires: a step's update never does; a script
-- that backdates created_at is followed too), a TRUNCATE empties both. run_keys has no
-- primary key: its rows are found by (created_at, thread_id). Each trigger has a function of
-- its own, as each names its own transition table.
CREATE TABLE run_keys (
    thread_id TEXT NOT NULL,
    agent TEXT NOT NULL,
    version TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
INSERT INTO run_keys (thread_id, agent, version, created_at)
SELECT thread_id, agent, version, created_at FROM runs;
CREATE INDEX run_keys_created ON run_keys (created_at, thread_id);
CREATE INDEX run_keys_agent ON run_keys (agent, created_at, thread_id, version);
CREATE INDEX run_keys_version ON run_keys (version, created_at, thread_id, agent);

CREATE FUNCTION run_keys_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_keys (thread_id, agent, version, created_at)
    SELECT thread_id, agent, version, created_at FROM added;
    RETURN NULL;
END $$;
CREATE TRIGGER run_keys_added AFTER INSERT ON runs REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION run_keys_added();

-- Each removed run's key found through run_keys_created, one lookup per run, and deleted by
-- TID: a join with the transition table (no statistics) can be planned, and kept in the
-- function's plan cache, as a scan of run_keys for every removed run.
CREATE FUNCTION run_keys_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_keys WHERE ctid = ANY (ARRAY(
        SELECT (SELECT k.ctid FROM run_keys k
                WHERE k.created_at = removed.created_at AND k.thread_id = removed.thread_id)
        FROM removed));
    RETURN NULL;
END $$;
CREATE TRIGGER run_keys_removed AFTER DELETE ON runs REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION run_keys_removed();

CREATE FUNCTION run_keys_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE run_keys SET thread_id = NEW.thread_id, agent = NEW.agent, version = NEW.version,
                        created_at = NEW.created_at
    WHERE created_at = OLD.created_at AND thread_id = OLD.thread_id;
    RETURN NULL;
END $$;
CREATE TRIGGER run_keys_moved AFTER UPDATE OF thread_id, agent, version, created_at ON runs
    FOR EACH ROW WHEN ((OLD.thread_id, OLD.agent, OLD.version, OLD.created_at)
                       IS DISTINCT FROM (NEW.thread_id, NEW.agent, NEW.version, NEW.created_at))
    EXECUTE FUNCTION run_keys_moved();

-- (DELETE, not TRUNCATE: a TRUNCATE naming both tables has run_keys open meanwhile.)
CREATE FUNCTION run_keys_emptied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_keys;
    RETURN NULL;
END $$;
CREATE TRIGGER run_keys_emptied AFTER TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION run_keys_emptied();

DROP INDEX runs_created;
DROP INDEX runs_agent;
DROP INDEX runs_version;
-- The idempotency key's uniqueness, for the runs that have one: a btree indexes NULLs too, so
-- the constraint's index took an entry for every keyless run on every change as well.
-- (create_run's ON CONFLICT names no target: any unique index refuses a second copy.)
ALTER TABLE runs DROP CONSTRAINT runs_idempotency_key_key;
CREATE UNIQUE INDEX runs_idempotency ON runs (idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Pending interrupts by age (the list of questions waiting for a person, and advise's count):
-- the pending ones only, as its name says; an answered interrupt leaves it, where it took a
-- new entry when it was answered.
DROP INDEX interrupts_pending;
CREATE INDEX interrupts_pending ON interrupts (status, created_at) WHERE status = 'pending';
