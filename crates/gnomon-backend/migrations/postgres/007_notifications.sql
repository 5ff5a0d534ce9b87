-- The notification outbox: written with the outcome it tells of, sent by
-- the leader.

CREATE TABLE IF NOT EXISTS notifications (
id TEXT NOT NULL PRIMARY KEY, run_id TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
outcome TEXT NOT NULL, target TEXT NOT NULL, state TEXT NOT NULL, attempts BIGINT NOT NULL,
next_at BIGINT NOT NULL, last_error TEXT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL);

CREATE INDEX IF NOT EXISTS notifications_by_run ON notifications (run_id);

CREATE INDEX IF NOT EXISTS notifications_due ON notifications (next_at) WHERE state = 'pending';
