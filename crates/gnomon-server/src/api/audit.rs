//! What the audit log (`target: "gnomon::audit"`) may show of a request:
//! text a caller chose, with every control character escaped (so no path
//! can write a line of its own), the namespace the request is for, and a
//! bound on how many refused reads are logged.

use std::sync::atomic::{AtomicU64, Ordering};

use gnomon_core::spec::DEFAULT_NAMESPACE;

/// The most of a caller's text one audit field shows.
const MAX_SHOWN: usize = 256;

/// `text` as an audit field shows it: control characters (newlines
/// included) and backslashes escaped, cut at [`MAX_SHOWN`] bytes.
pub fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_SHOWN) + 8);
    for c in text.chars() {
        if out.len() >= MAX_SHOWN {
            out.push('…');
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// The namespace a REST request is for: its `namespace` query parameter,
/// or the default namespace; shown as [`shown`] does.
pub fn namespace_of(query: Option<&str>) -> String {
    let pairs: Vec<(String, String)> = query.and_then(|q| serde_urlencoded::from_str(q).ok()).unwrap_or_default();
    let given = pairs.into_iter().find(|(k, _)| k == "namespace").map(|(_, v)| v);
    shown(given.as_deref().unwrap_or(DEFAULT_NAMESPACE))
}

/// Refused reads logged per second, at most; the rest are counted and
/// the count is logged with the next one let through.
const REFUSED_READS_PER_SECOND: u64 = 20;

/// A per-second budget of audit lines.
pub struct Budget {
    /// The second (Unix) of the current window, and the lines it logged.
    window: AtomicU64,
    used: AtomicU64,
    dropped: AtomicU64,
}

impl Budget {
    pub const fn new() -> Self {
        Self { window: AtomicU64::new(0), used: AtomicU64::new(0), dropped: AtomicU64::new(0) }
    }

    /// Whether a line may be logged in the second `now_s`; `Some(n)` with
    /// the lines not logged since the last one that was.
    pub fn take(&self, now_s: u64) -> Option<u64> {
        if self.window.swap(now_s, Ordering::Relaxed) != now_s {
            self.used.store(0, Ordering::Relaxed);
        }
        if self.used.fetch_add(1, Ordering::Relaxed) >= REFUSED_READS_PER_SECOND {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.dropped.swap(0, Ordering::Relaxed))
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self::new()
    }
}

/// The budget of refused reads, for the whole process.
pub static REFUSED_READS: Budget = Budget::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_caller_text_can_start_a_line_of_its_own() {
        assert_eq!(shown("/v1/hooks/a/b\n2026-01-01 INFO gnomon::audit forged"), "/v1/hooks/a/b\\n2026-01-01 INFO gnomon::audit forged");
        assert_eq!(shown("a\r\u{1b}[31m\u{0}\\n"), "a\\r\\u{1b}[31m\\u{0}\\\\n");
        assert!(shown(&"x".repeat(10_000)).len() < MAX_SHOWN + 8);
        assert_eq!(shown("team-a"), "team-a");
    }

    #[test]
    fn the_namespace_comes_from_the_query() {
        assert_eq!(namespace_of(None), "default");
        assert_eq!(namespace_of(Some("count=2&namespace=team-b")), "team-b");
        assert_eq!(namespace_of(Some("namespace=a%0Ab")), "a\\nb");
    }

    #[test]
    fn refused_reads_are_logged_within_a_budget_and_the_rest_counted() {
        let b = Budget::new();
        for _ in 0..REFUSED_READS_PER_SECOND {
            assert_eq!(b.take(7), Some(0));
        }
        assert_eq!(b.take(7), None);
        assert_eq!(b.take(7), None);
        assert_eq!(b.take(8), Some(2), "the next second's first line counts the lines left out");
    }
}
