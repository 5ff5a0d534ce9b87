//! An attempt's fence: what identifies it to fenced writes (the
//! `gnomon-fence` crate and the SDKs' guards).

use std::fmt;

/// An attempt of a run and the leader token it was assigned under. Of two
/// attempts of one run, the later has the higher attempt number and a token
/// no lower; a guarded write admits an attempt only while no recorded
/// write has a higher attempt or a higher token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The run: the same for every attempt.
    pub run_id: String,
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// The leader's fencing token the attempt was assigned under.
    pub token: u64,
}

/// Why a fence could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceParseError {
    /// A value is absent (its name).
    #[error("no {0} to fence with")]
    Missing(String),
    /// A value is not what it should be.
    #[error("not a fence: {0}")]
    Invalid(String),
}

impl Fence {
    /// Reads a fence through `get`, which looks up `run_id`, `attempt` and
    /// `token` under the names it is given (an environment, headers).
    pub fn read(names: [&str; 3], get: impl Fn(&str) -> Option<String>) -> Result<Fence, FenceParseError> {
        let value = |k: &str| get(k).ok_or_else(|| FenceParseError::Missing(k.to_string()));
        let (run_id, attempt, token) = (value(names[0])?, value(names[1])?, value(names[2])?);
        let bad = |what: &str, v: &str| FenceParseError::Invalid(format!("{what} {v:?}"));
        if run_id.is_empty() || run_id.len() > 255 {
            return Err(bad("run id", &run_id));
        }
        let attempt: u32 = attempt.trim().parse().map_err(|_| bad("attempt", &attempt))?;
        if attempt == 0 {
            return Err(bad("attempt", "0"));
        }
        Ok(Fence { run_id, attempt, token: token.trim().parse().map_err(|_| bad("fence token", &token))? })
    }

    /// The fence of a shell job's attempt (`GNOMON_RUN_ID`,
    /// `GNOMON_ATTEMPT`, `GNOMON_FENCE_TOKEN`).
    pub fn from_env() -> Result<Fence, FenceParseError> {
        Fence::read(["GNOMON_RUN_ID", "GNOMON_ATTEMPT", "GNOMON_FENCE_TOKEN"], |k| std::env::var(k).ok())
    }

    /// Whether a write recorded for `(attempt, token)` shuts this attempt
    /// out.
    pub fn superseded_by(&self, attempt: u32, token: u64) -> bool {
        attempt > self.attempt || token > self.token
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} attempt {} token {}", self.run_id, self.attempt, self.token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_and_compare() {
        let env = |k: &str| match k {
            "R" => Some("abc-1000".to_string()),
            "A" => Some("2".to_string()),
            "T" => Some("7".to_string()),
            _ => None,
        };
        let f = Fence::read(["R", "A", "T"], env).unwrap();
        assert_eq!(f, Fence { run_id: "abc-1000".into(), attempt: 2, token: 7 });
        assert!(matches!(Fence::read(["R", "A", "X"], env), Err(FenceParseError::Missing(_))));
        assert!(matches!(Fence::read(["R", "T", "R"], env), Err(FenceParseError::Invalid(_))));
        assert!(!f.superseded_by(2, 7) && !f.superseded_by(1, 7));
        assert!(f.superseded_by(3, 7) && f.superseded_by(2, 8));
    }
}
