-- A dependency run's origin and edges (`gnomon_core::deps::RunAfter` as
-- JSON).
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

ALTER TABLE runs ADD COLUMN upstream MEDIUMTEXT NULL;
