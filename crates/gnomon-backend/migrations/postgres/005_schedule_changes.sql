-- When a job's schedule last changed and what it was: a new leader fires
-- the old schedule's due times up to the change without having seen it.

ALTER TABLE jobs ADD COLUMN IF NOT EXISTS schedule_changed_at BIGINT, ADD COLUMN IF NOT EXISTS previous_schedule TEXT;
