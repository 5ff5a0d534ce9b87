-- Manual runs have ids of their own (`<uid>-m<instant>`), so a manual run
-- and a scheduled one may share `(job_uid, scheduled_at)`: the run id alone
-- is unique.
-- SQLite drops a table constraint by copying the table.

DROP TABLE IF EXISTS runs_v4;

CREATE TABLE runs_v4 (
   seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
   job_uid TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
   scheduled_at INTEGER NOT NULL, fired_at INTEGER NOT NULL,
   state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, reason TEXT,
   next_attempt_at INTEGER, manual INTEGER NOT NULL DEFAULT 0,
   cancel_requested INTEGER NOT NULL DEFAULT 0, updated_at INTEGER NOT NULL);

INSERT INTO runs_v4 (seq, id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, reason,
                     next_attempt_at, manual, cancel_requested, updated_at)
   SELECT seq, id, job_uid, namespace, job, scheduled_at, fired_at, state, attempt, reason,
          next_attempt_at, manual, cancel_requested, updated_at FROM runs;

DROP TABLE runs;

ALTER TABLE runs_v4 RENAME TO runs;

CREATE INDEX runs_by_job ON runs (namespace, job, seq);

CREATE INDEX runs_by_state ON runs (state, seq);

CREATE INDEX runs_cancel ON runs (state) WHERE cancel_requested = 1;
