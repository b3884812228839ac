-- What a journaled call was given, for people (the run page beside its result): JSON text,
-- bounded, secrets masked (tether.calls.args_preview). NULL for a call made with no
-- arguments and for every call journaled before this column. Never read to replay.
ALTER TABLE journal ADD COLUMN args TEXT;
