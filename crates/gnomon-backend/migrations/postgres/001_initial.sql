-- The first schema: jobs and their change feed, runs, attempts, the
-- leadership record and epochs.

CREATE TABLE jobs (
uid TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL,
version BIGINT NOT NULL, paused BIGINT NOT NULL DEFAULT 0,
created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
last_scheduled_at BIGINT, change_seq BIGINT NOT NULL,
UNIQUE (namespace, name));

CREATE INDEX jobs_change_seq ON jobs (change_seq);

CREATE TABLE job_deletions (uid TEXT PRIMARY KEY, change_seq BIGINT NOT NULL);

CREATE INDEX job_deletions_seq ON job_deletions (change_seq);

CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);

INSERT INTO counters (name, value) VALUES ('job_change_seq', 0);

CREATE TABLE runs (
seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL UNIQUE,
job_uid TEXT NOT NULL, namespace TEXT NOT NULL, job TEXT NOT NULL,
scheduled_at BIGINT NOT NULL, fired_at BIGINT NOT NULL,
state TEXT NOT NULL, attempt BIGINT NOT NULL DEFAULT 0, reason TEXT,
next_attempt_at BIGINT, manual BIGINT NOT NULL DEFAULT 0,
cancel_requested BIGINT NOT NULL DEFAULT 0, updated_at BIGINT NOT NULL,
UNIQUE (job_uid, scheduled_at));

CREATE INDEX runs_open ON runs (state) WHERE state IN ('pending', 'assigned', 'running', 'retrying');

CREATE INDEX runs_by_job ON runs (namespace, job, seq);

CREATE INDEX runs_by_state ON runs (state, seq);

CREATE TABLE attempts (
run_id TEXT NOT NULL, attempt BIGINT NOT NULL, worker TEXT NOT NULL, token BIGINT NOT NULL,
state TEXT NOT NULL, assigned_at BIGINT NOT NULL, started_at BIGINT, ended_at BIGINT,
exit_code BIGINT, output TEXT NOT NULL DEFAULT '',
PRIMARY KEY (run_id, attempt));

CREATE TABLE leadership (
scope TEXT PRIMARY KEY, token BIGINT NOT NULL, holder TEXT NOT NULL,
address TEXT NOT NULL, backend TEXT NOT NULL, since BIGINT NOT NULL);

CREATE TABLE epochs (scope TEXT PRIMARY KEY, epoch BIGINT NOT NULL);
