-- Worker bindings: each worker id with the credential that first opened a
-- worker session with it (kept until an admin releases the id; retention
-- never deletes one). Safe to run again.

CREATE TABLE IF NOT EXISTS worker_bindings (
    worker VARCHAR(128) NOT NULL PRIMARY KEY, credential VARCHAR(255) NOT NULL, bound_at BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
