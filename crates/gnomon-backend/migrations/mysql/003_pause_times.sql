-- When a job was last paused and resumed: a new leader starts a resumed
-- job's timeline at its resumption (and fires what was due before the
-- pause) without having seen either.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

ALTER TABLE jobs ADD COLUMN paused_at BIGINT NULL, ADD COLUMN resumed_at BIGINT NULL;
