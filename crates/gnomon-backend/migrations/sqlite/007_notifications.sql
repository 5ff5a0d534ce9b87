-- The notification outbox: written with the outcome it tells of, sent by
-- the leader.

CREATE TABLE notifications (
   id TEXT NOT NULL PRIMARY KEY, run_id TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
   outcome TEXT NOT NULL, target TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL,
   next_at INTEGER NOT NULL, last_error TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE INDEX notifications_by_run ON notifications (run_id);

CREATE INDEX notifications_due ON notifications (next_at) WHERE state = 'pending';
