-- The committed leader time: a new leader's clock never runs below it.

ALTER TABLE leadership ADD COLUMN leader_time INTEGER NOT NULL DEFAULT 0;
