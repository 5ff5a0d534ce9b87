-- The committed leader time: a new leader's clock never runs below it.

ALTER TABLE leadership ADD COLUMN IF NOT EXISTS leader_time BIGINT NOT NULL DEFAULT 0;
