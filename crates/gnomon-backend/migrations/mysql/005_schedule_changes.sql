-- When a job's schedule last changed and what it was: a new leader fires
-- the old schedule's due times up to the change without having seen it.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

ALTER TABLE jobs ADD COLUMN schedule_changed_at BIGINT NULL, ADD COLUMN previous_schedule TEXT NULL;
