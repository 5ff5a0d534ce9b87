-- The notification outbox: written with the outcome it tells of, sent by
-- the leader.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

CREATE TABLE IF NOT EXISTS notifications (
    id VARCHAR(96) NOT NULL PRIMARY KEY, run_id VARCHAR(64) NOT NULL, namespace VARCHAR(64) NOT NULL,
    job VARCHAR(128) NOT NULL, outcome VARCHAR(16) NOT NULL, target TEXT NOT NULL, state VARCHAR(16) NOT NULL,
    attempts BIGINT NOT NULL, next_at BIGINT NOT NULL, last_error TEXT NULL,
    created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
    KEY notifications_by_run (run_id), KEY notifications_due (state, next_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
