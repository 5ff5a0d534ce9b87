-- A dependency run's origin and edges (`gnomon_core::deps::RunAfter` as
-- JSON).
-- `waiting`, an open state, is found by `runs_by_state` like the others.
-- (An earlier form of this step also recreated `runs_open` with `waiting`
-- in it; a database it migrated keeps that index, which nothing reads.)

ALTER TABLE runs ADD COLUMN upstream TEXT;
