-- Job edges: one row per `after` edge (the downstream job runs after the
-- upstream one), kept by every job write in its own transaction, so a
-- run's answer reads only the jobs after its own. Filled from the jobs
-- stored before.

CREATE TABLE IF NOT EXISTS job_edges (
namespace TEXT NOT NULL, upstream TEXT NOT NULL, downstream TEXT NOT NULL,
PRIMARY KEY (namespace, upstream, downstream));

INSERT INTO job_edges (namespace, upstream, downstream)
   SELECT j.namespace, e.value ->> 'job', j.name
   FROM jobs j, jsonb_array_elements(CAST(j.spec AS jsonb) -> 'after') AS e(value)
   WHERE j.spec LIKE '%"after"%' AND jsonb_typeof(CAST(j.spec AS jsonb) -> 'after') = 'array' AND e.value ->> 'job' IS NOT NULL
   ON CONFLICT DO NOTHING;
