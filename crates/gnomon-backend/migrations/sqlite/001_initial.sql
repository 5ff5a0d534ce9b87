-- The first schema: jobs and their change feed, runs, attempts, the
-- leadership record and epochs.

CREATE TABLE jobs (
uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
version INTEGER NOT NULL, paused INTEGER NOT NULL DEFAULT 0,
created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
last_scheduled_at INTEGER, change_seq INTEGER NOT NULL,
UNIQUE (namespace, name));

CREATE INDEX jobs_change_seq ON jobs (change_seq);

CREATE TABLE job_deletions (uid TEXT PRIMARY KEY, change_seq INTEGER NOT NULL);

CREATE INDEX job_deletions_seq ON job_deletions (change_seq);

CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);

INSERT INTO counters (name, value) VALUES ('job_change_seq', 0);

CREATE TABLE runs (
seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
job_uid TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
scheduled_at INTEGER NOT NULL, fired_at INTEGER NOT NULL,
state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, reason TEXT,
next_attempt_at INTEGER, manual INTEGER NOT NULL DEFAULT 0,
cancel_requested INTEGER NOT NULL DEFAULT 0, updated_at INTEGER NOT NULL,
UNIQUE (job_uid, scheduled_at));

CREATE INDEX runs_open ON runs (state) WHERE state IN ('pending', 'assigned', 'running', 'retrying');

CREATE INDEX runs_by_job ON runs (namespace, job, seq);

CREATE INDEX runs_by_state ON runs (state, seq);

CREATE TABLE attempts (
run_id TEXT NOT NULL, attempt INTEGER NOT NULL, worker TEXT NOT NULL, token INTEGER NOT NULL,
state TEXT NOT NULL, assigned_at INTEGER NOT NULL, started_at INTEGER, ended_at INTEGER,
exit_code INTEGER, output TEXT NOT NULL DEFAULT '',
PRIMARY KEY (run_id, attempt));

CREATE TABLE leadership (
scope TEXT PRIMARY KEY, token INTEGER NOT NULL, holder TEXT NOT NULL,
address TEXT NOT NULL, backend TEXT NOT NULL, since INTEGER NOT NULL);

CREATE TABLE epochs (scope TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
