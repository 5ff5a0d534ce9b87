//! Long attempts through every fault: a failover, a rebuild or a lost
//! database connection changes nothing a live worker is doing. Each fault
//! starts while attempts of a job that runs for seconds (with a timeout)
//! are running; every one of them must end `succeeded` on attempt 1.

use std::time::Duration;

use super::*;

/// How long each long attempt runs, and the job's timeout.
const LONG_SECS: u64 = 8;
const LONG_TIMEOUT: &str = "40s";

impl Ha {
    /// Creates `long`: a manual job that sleeps, with a timeout and retries
    /// (so an attempt ended early would run again, and be seen).
    pub(super) fn create_long_job(&self) {
        let l = self.leader(Duration::from_secs(30));
        let job = json!({"name": "long", "executor": {"shell": {"command": "sleep", "args": [LONG_SECS.to_string()]}},
                         "timeout": LONG_TIMEOUT,
                         "retry": {"max_attempts": 3, "backoff": {"initial": "100ms", "max": "1s", "multiplier": 2.0, "jitter": 0}}});
        let (code, body) = self.api(l, "POST", "/v1/jobs", Some(job));
        assert_eq!(code, 201, "{body}");
    }

    /// Starts `n` long runs and waits until each is running on a worker.
    pub(super) fn start_long(&mut self, n: u32) {
        let l = self.leader(Duration::from_secs(30));
        let (code, body) = self.api(l, "POST", &format!("/v1/jobs/long/trigger?count={n}"), None);
        assert!(code < 300, "{body}");
        let ids: Vec<String> = match body["ids"].as_array() {
            Some(ids) => ids.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            None => vec![body["id"].as_str().expect("a run id").to_string()],
        };
        wait_until("the long runs to be running", Duration::from_secs(30), || {
            ids.iter().all(|id| {
                let d = self.rt.block_on(self.store.get_run(id)).expect("get run").expect("run exists");
                d.run.state == gnomon_core::RunState::Running
            })
        });
        self.long_runs.extend(ids);
    }

    /// Both workers frozen for less than the fraction of the lease after
    /// which they fence themselves, while long attempts run.
    pub(super) fn pause_workers(&mut self) {
        self.start_long(2);
        for w in &self._workers {
            w.signal(SIGSTOP);
        }
        std::thread::sleep(Duration::from_secs(3));
        for w in &self._workers {
            w.signal(SIGCONT);
        }
        eprintln!("workers paused for 3 s with long attempts running");
    }

    /// Every long run succeeded on its first attempt.
    pub(super) fn check_long_runs(&self) {
        wait_until("every long run to end", Duration::from_secs(90), || {
            self.long_runs.iter().all(|id| {
                let d = self.rt.block_on(self.store.get_run(id)).expect("get run").expect("run exists");
                d.run.state.is_terminal()
            })
        });
        let mut bad = Vec::new();
        for id in &self.long_runs {
            let d = self.rt.block_on(self.store.get_run(id)).expect("get run").expect("run exists");
            if d.run.state != gnomon_core::RunState::Succeeded || d.attempts.len() != 1 {
                let attempts: Vec<String> = d
                    .attempts
                    .iter()
                    .map(|a| {
                        format!(
                            "#{} on {} {} after {:?} ms: {:?}",
                            a.attempt,
                            a.worker,
                            a.state.as_str(),
                            a.ended_at.map(|e| e - a.assigned_at),
                            a.output
                        )
                    })
                    .collect();
                bad.push(format!("{id}: {} {:?} {attempts:?}", d.run.state.as_str(), d.run.reason));
            }
        }
        if !bad.is_empty() {
            // What the replicas say of their terms and sessions, to read
            // when a worker went unacknowledged.
            let said: Vec<String> = self
                .replicas
                .iter()
                .filter_map(|r| r.proc.as_ref().map(|p| (r.id.clone(), p.log())))
                .map(|(id, log)| {
                    let lines: Vec<&str> = log
                        .lines()
                        .filter(|l| {
                            ["state loaded", "stepping down", "leader", "session", "lease", "lost", "resign"].iter().any(|k| l.contains(k))
                        })
                        .collect();
                    format!("--- {id}\n{}", lines.join("\n"))
                })
                .collect();
            panic!("long runs ended early or ran again across the faults:\n{}\n{}", bad.join("\n"), said.join("\n"));
        }
        eprintln!("{} long runs succeeded on attempt 1 through the faults", self.long_runs.len());
    }
}
