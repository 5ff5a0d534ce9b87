-- Fewer b-trees per write (SQLite): `runs_open` duplicated `runs_by_state`
-- (every state change moved an entry in both); cancel requests get a
-- partial index that only requested runs enter; attempts are keyed by their
-- primary key alone (no rowid b-tree beside it).

DROP INDEX IF EXISTS runs_open;

CREATE INDEX IF NOT EXISTS runs_cancel ON runs (state) WHERE cancel_requested = 1;

DROP TABLE IF EXISTS attempts_v2;

CREATE TABLE attempts_v2 (
   run_id TEXT NOT NULL, attempt INTEGER NOT NULL, worker TEXT NOT NULL, token INTEGER NOT NULL,
   state TEXT NOT NULL, assigned_at INTEGER NOT NULL, started_at INTEGER, ended_at INTEGER,
   exit_code INTEGER, output TEXT NOT NULL DEFAULT '',
   PRIMARY KEY (run_id, attempt)) WITHOUT ROWID;

INSERT INTO attempts_v2 (run_id, attempt, worker, token, state, assigned_at, started_at, ended_at, exit_code, output)
   SELECT run_id, attempt, worker, token, state, assigned_at, started_at, ended_at, exit_code, output FROM attempts;

DROP TABLE attempts;

ALTER TABLE attempts_v2 RENAME TO attempts;
