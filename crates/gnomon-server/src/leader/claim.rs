//! [`AskClaim`]: who decides an ask's fate, the leader or its caller. An
//! API call that asked for runs and stopped waiting (it answered an error,
//! or its client went away) withdraws its ask; the leader plans an ask only
//! if it claims it first. Exactly one of the two wins, so an ask answered
//! with an error is never written later, and one the leader planned names
//! its runs to a caller that stopped waiting.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

const WAITING: u8 = 0;
const PLANNED: u8 = 1;
const WITHDRAWN: u8 = 2;

#[derive(Debug, Default)]
struct Shared {
    state: AtomicU8,
    /// The ids of the runs the leader planned for the ask.
    ids: Mutex<Vec<String>>,
}

/// The shared fate of one ask. Cloned between the caller and the leader.
#[derive(Debug, Clone, Default)]
pub struct AskClaim(Arc<Shared>);

/// What became of an ask its caller stopped waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withdrawal {
    /// Nothing was planned, and nothing of it will be written.
    Withdrawn,
    /// The leader had planned these runs already: they may be written.
    Planned(Vec<String>),
}

impl AskClaim {
    /// The caller stops waiting: the ask is withdrawn unless the leader
    /// planned it first (then its runs are named).
    pub fn withdraw(&self) -> Withdrawal {
        match self.0.state.compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) | Err(WITHDRAWN) => Withdrawal::Withdrawn,
            Err(_) => Withdrawal::Planned(self.planned()),
        }
    }

    /// The runs the leader planned for the ask (empty: none yet).
    pub fn planned(&self) -> Vec<String> {
        self.0.ids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the caller withdrew the ask.
    pub fn is_withdrawn(&self) -> bool {
        self.0.state.load(Ordering::Acquire) == WITHDRAWN
    }

    /// The leader plans the ask's runs `ids`: false if it was withdrawn
    /// (then nothing may be planned).
    pub(crate) fn plan(&self, ids: impl IntoIterator<Item = String>) -> bool {
        match self.0.state.compare_exchange(WAITING, PLANNED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) | Err(PLANNED) => {
                self.0.ids.lock().unwrap_or_else(|p| p.into_inner()).extend(ids);
                true
            }
            Err(_) => false,
        }
    }
}

/// Two requests are alike whatever their claims.
impl PartialEq for AskClaim {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_withdrawn_ask_is_never_planned() {
        let c = AskClaim::default();
        assert_eq!(c.withdraw(), Withdrawal::Withdrawn);
        assert!(!c.plan(["r1".to_string()]));
        assert!(c.is_withdrawn());
        assert_eq!(c.withdraw(), Withdrawal::Withdrawn, "withdrawing twice is the same");
    }

    #[test]
    fn a_planned_ask_cannot_be_withdrawn_and_names_its_runs() {
        let c = AskClaim::default();
        assert!(c.plan(["r1".to_string()]));
        assert!(c.plan(["r2".to_string()]), "a later turn of the same ask plans more");
        assert_eq!(c.withdraw(), Withdrawal::Planned(vec!["r1".into(), "r2".into()]));
        assert!(!c.is_withdrawn());
    }

    #[test]
    fn exactly_one_side_wins_a_race() {
        for _ in 0..200 {
            let c = AskClaim::default();
            let d = c.clone();
            let t = std::thread::spawn(move || d.plan(["r".to_string()]));
            let w = c.withdraw();
            let planned = t.join().expect("thread");
            assert_eq!(planned, w != Withdrawal::Withdrawn, "{w:?} / planned {planned}");
        }
    }
}
