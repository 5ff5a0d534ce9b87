-- When a job's schedule last changed and what it was: a new leader fires
-- the old schedule's due times up to the change without having seen it.

ALTER TABLE jobs ADD COLUMN schedule_changed_at INTEGER;

ALTER TABLE jobs ADD COLUMN previous_schedule TEXT;
