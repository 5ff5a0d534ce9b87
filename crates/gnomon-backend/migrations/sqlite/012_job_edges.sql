-- Job edges: one row per `after` edge (the downstream job runs after the
-- upstream one), kept by every job write in its own transaction, so a
-- run's answer reads only the jobs after its own. Filled from the jobs
-- stored before.

CREATE TABLE IF NOT EXISTS job_edges (
   namespace TEXT NOT NULL, upstream TEXT NOT NULL, downstream TEXT NOT NULL,
   PRIMARY KEY (namespace, upstream, downstream)
);

INSERT OR IGNORE INTO job_edges (namespace, upstream, downstream)
   SELECT j.namespace, json_extract(e.value, '$.job'), j.name
   FROM jobs j, json_each(j.spec, '$.after') e
   WHERE j.spec LIKE '%"after"%' AND json_extract(e.value, '$.job') IS NOT NULL;
