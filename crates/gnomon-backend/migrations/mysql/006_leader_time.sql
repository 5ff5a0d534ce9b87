-- The committed leader time: a new leader's clock never runs below it.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

ALTER TABLE leadership ADD COLUMN leader_time BIGINT NOT NULL DEFAULT 0;
