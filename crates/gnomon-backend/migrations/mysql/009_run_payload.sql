-- The body of the webhook call that started a run.
-- MEDIUMTEXT: up to 64 KiB.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

ALTER TABLE runs ADD COLUMN payload MEDIUMTEXT NULL;
