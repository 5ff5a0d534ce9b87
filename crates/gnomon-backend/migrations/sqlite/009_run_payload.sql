-- The body of the webhook call that started a run.

ALTER TABLE runs ADD COLUMN payload TEXT;
