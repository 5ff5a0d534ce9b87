-- The values of a run's parameters (a JSON object), when its job declares
-- params.

ALTER TABLE runs ADD COLUMN params TEXT;
