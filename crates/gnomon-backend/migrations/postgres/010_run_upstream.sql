-- A dependency run's origin and edges (`gnomon_core::deps::RunAfter` as
-- JSON).
-- `waiting` is an open state: `runs_open` is recreated with it.

ALTER TABLE runs ADD COLUMN IF NOT EXISTS upstream TEXT;

DROP INDEX IF EXISTS runs_open;

CREATE INDEX IF NOT EXISTS runs_open ON runs (state) WHERE state IN ('waiting', 'pending', 'assigned', 'running', 'retrying');
