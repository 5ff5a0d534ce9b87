-- The first schema: jobs and their change feed, runs, attempts, the
-- leadership record and epochs.
-- MySQL commits DDL at once: the step is safe to run again (IF NOT EXISTS,
-- INSERT IGNORE, or a change the runner finds already made; see
-- `sql/migrate.rs`).

CREATE TABLE IF NOT EXISTS jobs (
    uid VARCHAR(32) NOT NULL PRIMARY KEY, namespace VARCHAR(64) NOT NULL, name VARCHAR(128) NOT NULL,
    spec MEDIUMTEXT NOT NULL, version BIGINT NOT NULL, paused BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
    last_scheduled_at BIGINT NULL, change_seq BIGINT NOT NULL,
    UNIQUE KEY jobs_name (namespace, name), KEY jobs_change_seq (change_seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS job_deletions (uid VARCHAR(32) NOT NULL PRIMARY KEY, change_seq BIGINT NOT NULL, KEY job_deletions_seq (change_seq))
ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS counters (name VARCHAR(64) NOT NULL PRIMARY KEY, value BIGINT NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT IGNORE INTO counters (name, value) VALUES ('job_change_seq', 0);

CREATE TABLE IF NOT EXISTS runs (
    seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, id VARCHAR(64) NOT NULL,
    job_uid VARCHAR(32) NOT NULL, namespace VARCHAR(64) NOT NULL, job VARCHAR(128) NOT NULL,
    scheduled_at BIGINT NOT NULL, fired_at BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL, attempt BIGINT NOT NULL DEFAULT 0, reason TEXT NULL,
    next_attempt_at BIGINT NULL, manual BIGINT NOT NULL DEFAULT 0,
    cancel_requested BIGINT NOT NULL DEFAULT 0, updated_at BIGINT NOT NULL,
    UNIQUE KEY runs_id (id), UNIQUE KEY runs_fire (job_uid, scheduled_at),
    KEY runs_by_job (namespace, job, seq), KEY runs_by_state (state, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS attempts (
    run_id VARCHAR(64) NOT NULL, attempt BIGINT NOT NULL, worker VARCHAR(255) NOT NULL, token BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL, assigned_at BIGINT NOT NULL, started_at BIGINT NULL, ended_at BIGINT NULL,
    exit_code BIGINT NULL, output MEDIUMTEXT NOT NULL,
    PRIMARY KEY (run_id, attempt)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS leadership (
    scope VARCHAR(128) NOT NULL PRIMARY KEY, token BIGINT NOT NULL, holder VARCHAR(255) NOT NULL,
    address VARCHAR(255) NOT NULL, backend VARCHAR(32) NOT NULL, since BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS epochs (scope VARCHAR(128) NOT NULL PRIMARY KEY, epoch BIGINT NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
