-- When a job was last paused and resumed: a new leader starts a resumed
-- job's timeline at its resumption (and fires what was due before the
-- pause) without having seen either.

ALTER TABLE jobs ADD COLUMN paused_at INTEGER;

ALTER TABLE jobs ADD COLUMN resumed_at INTEGER;
