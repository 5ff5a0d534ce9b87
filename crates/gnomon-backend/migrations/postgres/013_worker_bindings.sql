-- Worker bindings: each worker id with the credential that first opened a
-- worker session with it (kept until an admin releases the id; retention
-- never deletes one).

CREATE TABLE IF NOT EXISTS worker_bindings (
worker TEXT NOT NULL PRIMARY KEY, credential TEXT NOT NULL, bound_at BIGINT NOT NULL);
