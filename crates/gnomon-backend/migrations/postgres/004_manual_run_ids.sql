-- Manual runs have ids of their own (`<uid>-m<instant>`), so a manual run
-- and a scheduled one may share `(job_uid, scheduled_at)`: the run id alone
-- is unique.

ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_job_uid_scheduled_at_key;
