-- Job edges: one row per `after` edge (the downstream job runs after the
-- upstream one), kept by every job write in its own transaction, so a
-- run's answer reads only the jobs after its own. Filled from the jobs
-- stored before (a job has at most 8 upstreams; MariaDB 10.5 has no
-- JSON_TABLE, so each position is read by its path). Safe to run again.

CREATE TABLE IF NOT EXISTS job_edges (
    namespace VARCHAR(64) NOT NULL, upstream VARCHAR(128) NOT NULL, downstream VARCHAR(128) NOT NULL,
    PRIMARY KEY (namespace, upstream, downstream)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT IGNORE INTO job_edges (namespace, upstream, downstream)
    SELECT e.namespace, e.upstream, e.downstream FROM (
        SELECT j.namespace AS namespace, JSON_UNQUOTE(JSON_EXTRACT(j.spec, CONCAT('$.after[', p.i, '].job'))) AS upstream, j.name AS downstream
        FROM jobs j
        JOIN (SELECT 0 AS i UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7) p
        WHERE j.spec LIKE '%"after"%'
    ) e WHERE e.upstream IS NOT NULL;
