-- Manual runs have ids of their own (`<uid>-m<instant>`), so a manual run
-- and a scheduled one may share `(job_uid, scheduled_at)`: the run id alone
-- is unique.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

ALTER TABLE runs DROP INDEX runs_fire;
