-- Backfills: the requests to create the runs of a job's past instants.

CREATE TABLE IF NOT EXISTS backfills (
id TEXT PRIMARY KEY, namespace TEXT NOT NULL, job TEXT NOT NULL, job_uid TEXT NOT NULL,
from_ms BIGINT NOT NULL, to_ms BIGINT NOT NULL, params TEXT, rate BIGINT NOT NULL, total BIGINT NOT NULL,
cursor_ms BIGINT NOT NULL, state TEXT NOT NULL, created BIGINT NOT NULL, kept BIGINT NOT NULL, reason TEXT,
created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL);

CREATE INDEX IF NOT EXISTS backfills_by_state ON backfills (state);
