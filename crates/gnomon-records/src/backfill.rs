//! Backfill records: what the API writes when a backfill is asked for,
//! and the one rule by which every store moves it on (`advance`) or stops
//! it (`cancel`).

use gnomon_core::Millis;
use serde::{Deserialize, Serialize};

/// Where a backfill is: `running` until every instant of its range has a
/// record (`done`) or it is `cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackfillState {
    Running,
    Done,
    Cancelled,
}

impl BackfillState {
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillState::Running => "running",
            BackfillState::Done => "done",
            BackfillState::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [BackfillState::Running, BackfillState::Done, BackfillState::Cancelled].into_iter().find(|s| s.as_str() == text)
    }
}

/// A backfill as asked: a run for each instant of the job's schedule in
/// `[from, to]` that has no record yet, at most `rate` a second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewBackfill {
    pub id: String,
    pub namespace: String,
    pub job: String,
    pub job_uid: String,
    pub from: Millis,
    pub to: Millis,
    /// The values its runs record (resolved against the job's params).
    pub params: Option<String>,
    /// Instants per second.
    pub rate: u32,
    /// How many instants the range holds.
    pub total: u64,
}

/// A backfill as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackfillRecord {
    pub id: String,
    pub namespace: String,
    pub job: String,
    pub job_uid: String,
    pub from: Millis,
    pub to: Millis,
    pub params: Option<String>,
    pub rate: u32,
    pub total: u64,
    /// Every instant up to this one has been handled (`from - 1`: none).
    pub cursor: Millis,
    pub state: BackfillState,
    /// Instants it created a run for…
    pub created: u64,
    /// …and instants that had a record already (kept as they were).
    pub kept: u64,
    /// Why it ended, when it did.
    pub reason: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl BackfillRecord {
    /// The record of a backfill just asked for.
    pub fn new(b: &NewBackfill, now: Millis) -> BackfillRecord {
        BackfillRecord {
            id: b.id.clone(),
            namespace: b.namespace.clone(),
            job: b.job.clone(),
            job_uid: b.job_uid.clone(),
            from: b.from,
            to: b.to,
            params: b.params.clone(),
            rate: b.rate,
            total: b.total,
            cursor: b.from - 1,
            state: BackfillState::Running,
            created: 0,
            kept: 0,
            reason: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// Applies a progress report if it continues from this record's
    /// cursor while it runs (a compare-and-swap); whether it did.
    pub fn advance(&mut self, p: &BackfillProgress) -> bool {
        if self.state != BackfillState::Running || self.cursor != p.from_cursor || p.cursor < p.from_cursor {
            return false;
        }
        self.cursor = p.cursor;
        self.created = p.created;
        self.kept = p.kept;
        if let Some(reason) = &p.done {
            self.state = BackfillState::Done;
            self.reason = Some(reason.clone());
        }
        self.updated_at = p.at;
        true
    }

    /// Cancels it if it runs; whether it did.
    pub fn cancel(&mut self, now: Millis) -> bool {
        if self.state != BackfillState::Running {
            return false;
        }
        self.state = BackfillState::Cancelled;
        self.reason = Some("cancelled by request".into());
        self.updated_at = now;
        true
    }
}

/// The leader's report of a backfill's progress: from the cursor it read
/// to a later one, with the new totals; `done` (with why) once finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackfillProgress {
    pub id: String,
    pub from_cursor: Millis,
    pub cursor: Millis,
    pub created: u64,
    pub kept: u64,
    pub done: Option<String>,
    pub at: Millis,
}

/// The id of a backfill of `job_uid` asked for at `now` (the `n`-th of
/// that millisecond).
pub fn backfill_id(job_uid: &str, now: Millis) -> String {
    format!("{job_uid}-b{now}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> BackfillRecord {
        let b = NewBackfill {
            id: "b".into(),
            namespace: "n".into(),
            job: "j".into(),
            job_uid: "u".into(),
            from: 1000,
            to: 5000,
            params: None,
            rate: 1,
            total: 5,
        };
        BackfillRecord::new(&b, 7)
    }

    fn step(from_cursor: Millis, cursor: Millis, done: bool) -> BackfillProgress {
        BackfillProgress { id: "b".into(), from_cursor, cursor, created: 2, kept: 1, done: done.then(|| "all".into()), at: 9 }
    }

    #[test]
    fn progress_continues_only_from_the_cursor_and_never_after_an_end() {
        let mut b = record();
        assert_eq!((b.cursor, b.state), (999, BackfillState::Running), "nothing handled yet");
        assert!(!b.advance(&step(1000, 3000, false)), "not from its cursor");
        assert!(!b.advance(&step(999, 900, false)), "never backwards");
        assert!(b.advance(&step(999, 3000, false)));
        assert_eq!((b.cursor, b.created, b.kept, b.updated_at), (3000, 2, 1, 9));
        assert!(b.advance(&step(3000, 5000, true)));
        assert_eq!((b.state, b.reason.as_deref()), (BackfillState::Done, Some("all")));
        assert!(!b.advance(&step(5000, 5000, false)) && !b.cancel(10), "an ended backfill stays as it is");
        let mut c = record();
        assert!(c.cancel(10) && c.state == BackfillState::Cancelled);
        assert!(!c.advance(&step(999, 3000, false)), "no report revives a cancelled one");
        assert_eq!(BackfillState::parse("done"), Some(BackfillState::Done));
        assert_eq!(BackfillState::parse("later"), None);
    }
}
