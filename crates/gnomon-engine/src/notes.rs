//! [`Notes`]: what the view shows beside the sessions and the pressure.

use crate::HashMap;

/// What the view shows beside the sessions and the pressure: why each
/// job's runs wait in `pending`, and whether that changed since it was
/// last published.
#[derive(Default)]
pub struct Notes {
    /// Why a job's runs cannot be placed right now, by job uid.
    waiting: HashMap<String, String>,
    dirty: bool,
}

impl Notes {
    /// Job `uid`'s runs wait, for this reason.
    pub fn waiting(&mut self, uid: String, why: String) {
        if self.waiting.get(&uid) != Some(&why) {
            self.waiting.insert(uid, why);
            self.dirty = true;
        }
    }

    /// Job `uid`'s runs were placed.
    pub fn placed(&mut self, uid: &str) {
        if self.waiting.remove(uid).is_some() {
            self.dirty = true;
        }
    }

    /// Something else the view shows changed.
    pub fn touch(&mut self) {
        self.dirty = true;
    }

    /// Forgets every reason (a rebuild finds them again).
    pub fn reset(&mut self) {
        self.waiting.clear();
        self.dirty = true;
    }

    /// Whether the view is out of date, and the reasons to publish.
    pub fn take(&mut self) -> Option<HashMap<String, String>> {
        std::mem::take(&mut self.dirty).then(|| self.waiting.clone())
    }
}
