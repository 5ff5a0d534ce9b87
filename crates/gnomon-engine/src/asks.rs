//! Manual runs' instants.

use crate::Engine;
use gnomon_core::Millis;
use gnomon_records::JobRecord;

impl Engine {
    /// The first instant free for a manual run of `job` (now, or past the
    /// last one taken), with the job in the timeline.
    pub fn manual_start(&mut self, job: &JobRecord, now: Millis) -> Millis {
        if !self.cache.jobs.contains(&job.uid) {
            self.upsert_job(job.clone());
        }
        self.cache.jobs.get(&job.uid).map_or(now, |j| j.manual_next.max(now))
    }
}
