-- The values of a run's parameters (a JSON object), when its job declares
-- params.
-- MEDIUMTEXT: up to 64 KiB, past what TEXT holds.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

ALTER TABLE runs ADD COLUMN params MEDIUMTEXT NULL;
