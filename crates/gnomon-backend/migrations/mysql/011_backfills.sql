-- Backfills: the requests to create the runs of a job's past instants.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

CREATE TABLE IF NOT EXISTS backfills (
    id VARCHAR(255) NOT NULL PRIMARY KEY, namespace VARCHAR(64) NOT NULL, job VARCHAR(128) NOT NULL,
    job_uid VARCHAR(64) NOT NULL, from_ms BIGINT NOT NULL, to_ms BIGINT NOT NULL, params MEDIUMTEXT NULL,
    rate BIGINT NOT NULL, total BIGINT NOT NULL, cursor_ms BIGINT NOT NULL, state VARCHAR(16) NOT NULL,
    created BIGINT NOT NULL, kept BIGINT NOT NULL, reason TEXT NULL, created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL, KEY backfills_by_state (state)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
