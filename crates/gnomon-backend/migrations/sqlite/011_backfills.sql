-- Backfills: the requests to create the runs of a job's past instants.

CREATE TABLE backfills (
   id TEXT PRIMARY KEY, namespace TEXT NOT NULL, job TEXT NOT NULL, job_uid TEXT NOT NULL,
   from_ms INTEGER NOT NULL, to_ms INTEGER NOT NULL, params TEXT, rate INTEGER NOT NULL, total INTEGER NOT NULL,
   cursor_ms INTEGER NOT NULL, state TEXT NOT NULL, created INTEGER NOT NULL, kept INTEGER NOT NULL, reason TEXT,
   created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);

CREATE INDEX backfills_by_state ON backfills (state);
