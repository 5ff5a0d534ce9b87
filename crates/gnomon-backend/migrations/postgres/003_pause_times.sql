-- When a job was last paused and resumed: a new leader starts a resumed
-- job's timeline at its resumption (and fires what was due before the
-- pause) without having seen either.

ALTER TABLE jobs ADD COLUMN IF NOT EXISTS paused_at BIGINT, ADD COLUMN IF NOT EXISTS resumed_at BIGINT;
