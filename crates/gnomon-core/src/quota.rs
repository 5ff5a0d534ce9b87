//! Quotas per namespace: how much one namespace may ask of the leader, so
//! that no namespace can take the store, the leader's memory or the
//! workers from the others.
//!
//! | quota | counts | default |
//! | --- | --- | --- |
//! | `request_bytes` | params and payload of every run one request creates, its downstream runs included | 8 MiB |
//! | `open_runs` | open runs (pending, waiting, retrying, running), keyed runs still held after they ended, plus the instants running backfills have still to create | 100,000 |
//! | `open_bytes` | params and payload bytes of the open runs and of the keyed runs still held | 256 MiB |
//! | `backfills` | backfills running at once | 4 |
//! | `downstream_runs` | dependency runs one run makes (the jobs that run after its job, at any depth) | 100 |
//!
//! A request over a quota is refused whole ([`QuotaExceeded`]) and writes
//! nothing. A trigger is also refused (as [`QuotaName::Backlog`]) while its
//! namespace's backlog is past backpressure's red line, which is no quota
//! of its own: `--max-pending` sets it for every namespace. Quotas are set with `--quota [NAMESPACE:]NAME=VALUE`: without a
//! namespace a value is the default of every namespace, with one it is that
//! namespace's own. Pure: the leader counts, this decides.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The quotas of one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Quota {
    /// The params and payload bytes of every run one request creates
    /// (its downstream runs included).
    pub request_bytes: u64,
    /// Open runs and held keyed runs, plus the instants running backfills
    /// have still to create.
    pub open_runs: u64,
    /// The params and payload bytes of the open runs and held keyed runs.
    pub open_bytes: u64,
    /// Backfills running at once.
    pub backfills: u64,
    /// Dependency runs one run makes, at any depth.
    pub downstream_runs: u64,
}

impl Default for Quota {
    fn default() -> Self {
        Self { request_bytes: 8 << 20, open_runs: 100_000, open_bytes: 256 << 20, backfills: 4, downstream_runs: 100 }
    }
}

/// The name of one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QuotaName {
    /// [`Quota::request_bytes`].
    RequestBytes,
    /// [`Quota::open_runs`].
    OpenRuns,
    /// [`Quota::open_bytes`].
    OpenBytes,
    /// [`Quota::backfills`].
    Backfills,
    /// [`Quota::downstream_runs`].
    DownstreamRuns,
    /// A namespace's backlog (pending and waiting runs) past backpressure's
    /// red line: not set with `--quota` (`--max-pending` sets the line),
    /// and not in [`QuotaName::ALL`].
    Backlog,
}

impl QuotaName {
    /// Every quota set with `--quota`, in the order the API lists them.
    pub const ALL: [QuotaName; 5] =
        [QuotaName::RequestBytes, QuotaName::OpenRuns, QuotaName::OpenBytes, QuotaName::Backfills, QuotaName::DownstreamRuns];

    /// The name as flags, the API and metrics write it.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaName::RequestBytes => "request_bytes",
            QuotaName::OpenRuns => "open_runs",
            QuotaName::OpenBytes => "open_bytes",
            QuotaName::Backfills => "backfills",
            QuotaName::DownstreamRuns => "downstream_runs",
            QuotaName::Backlog => "backlog",
        }
    }

    fn parse(text: &str) -> Option<QuotaName> {
        QuotaName::ALL.into_iter().find(|q| q.as_str() == text)
    }

    /// How long a refused caller should wait before asking again, in
    /// seconds: what is counted over time (open runs, backfills) frees as
    /// runs end; a request too large for its quota never fits, and is told
    /// to wait a minute (and to ask for less).
    pub fn retry_after_secs(self) -> u64 {
        match self {
            QuotaName::OpenRuns | QuotaName::OpenBytes | QuotaName::Backfills | QuotaName::Backlog => 5,
            QuotaName::RequestBytes | QuotaName::DownstreamRuns => 60,
        }
    }
}

impl fmt::Display for QuotaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Quota {
    /// The limit of quota `name` ([`QuotaName::Backlog`] has none here:
    /// no limit).
    pub fn limit(&self, name: QuotaName) -> u64 {
        match name {
            QuotaName::RequestBytes => self.request_bytes,
            QuotaName::OpenRuns => self.open_runs,
            QuotaName::OpenBytes => self.open_bytes,
            QuotaName::Backfills => self.backfills,
            QuotaName::DownstreamRuns => self.downstream_runs,
            QuotaName::Backlog => u64::MAX,
        }
    }

    fn set(&mut self, name: QuotaName, value: u64) {
        match name {
            QuotaName::RequestBytes => self.request_bytes = value,
            QuotaName::OpenRuns => self.open_runs = value,
            QuotaName::OpenBytes => self.open_bytes = value,
            QuotaName::Backfills => self.backfills = value,
            QuotaName::DownstreamRuns => self.downstream_runs = value,
            QuotaName::Backlog => {}
        }
    }

    /// Refuses a request that would take quota `name` from `usage` past
    /// its limit by `asked`.
    pub fn check(&self, namespace: &str, name: QuotaName, usage: u64, asked: u64) -> Result<(), QuotaExceeded> {
        let limit = self.limit(name);
        if usage.saturating_add(asked) > limit {
            return Err(QuotaExceeded { namespace: namespace.to_string(), quota: name, limit, usage, asked });
        }
        Ok(())
    }
}

/// A request refused by a quota: nothing of it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[error("namespace {namespace:?} is over its {quota} quota: {usage} in use, {asked} asked, {limit} allowed")]
pub struct QuotaExceeded {
    /// The namespace whose quota it is.
    pub namespace: String,
    /// Which quota.
    pub quota: QuotaName,
    /// Its limit in that namespace.
    pub limit: u64,
    /// What the namespace uses now (0 for a quota per request).
    pub usage: u64,
    /// What the request asked for.
    pub asked: u64,
}

/// The quotas of every namespace: a default, and each namespace's own
/// values on top of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quotas {
    default: Quota,
    /// A namespace's own values (the rest are the default's).
    own: BTreeMap<String, Vec<(QuotaName, u64)>>,
}

impl Quotas {
    /// The quotas of `namespace`.
    pub fn of(&self, namespace: &str) -> Quota {
        let mut q = self.default;
        for &(name, value) in self.own.get(namespace).map(Vec::as_slice).unwrap_or_default() {
            q.set(name, value);
        }
        q
    }

    /// The namespaces with values of their own.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.own.keys().map(String::as_str)
    }

    /// Reads `--quota` values: `NAME=VALUE` sets the default of every
    /// namespace, `NAMESPACE:NAME=VALUE` one namespace's own. A byte quota
    /// takes a size (`8MiB`); the others a count. Every quota is at least 1.
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<Quotas, String> {
        let mut quotas = Quotas::default();
        for spec in specs {
            let spec = spec.as_ref().trim();
            let (target, value) = spec.split_once('=').ok_or_else(|| format!("quota {spec:?}: expected [NAMESPACE:]NAME=VALUE"))?;
            let (namespace, name) = match target.split_once(':') {
                Some((ns, name)) => (Some(ns), name),
                None => (None, target),
            };
            let name = QuotaName::parse(name.trim()).ok_or_else(|| {
                let names: Vec<&str> = QuotaName::ALL.iter().map(|q| q.as_str()).collect();
                format!("quota {spec:?}: unknown quota {name:?} (one of {})", names.join(", "))
            })?;
            let value = value.trim();
            let value = match name {
                QuotaName::RequestBytes | QuotaName::OpenBytes => crate::spec::parse_bytes(value),
                _ => value.replace('_', "").parse::<u64>().map_err(|_| format!("{value:?} is not a whole number")),
            }
            .map_err(|e| format!("quota {spec:?}: {e}"))?;
            if value == 0 {
                return Err(format!("quota {spec:?}: must be at least 1"));
            }
            match namespace {
                Some(ns) => {
                    let ns = ns.trim();
                    if crate::spec::validate_name("namespace", ns, crate::spec::MAX_NAMESPACE_LEN).is_err() {
                        return Err(format!("quota {spec:?}: {ns:?} is not a namespace name"));
                    }
                    let own = quotas.own.entry(ns.to_string()).or_default();
                    own.retain(|(n, _)| *n != name);
                    own.push((name, value));
                }
                None => quotas.default.set(name, value),
            }
        }
        Ok(quotas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_value_overrides_the_default_in_any_order() {
        let q = Quotas::parse(&["team-a:open_runs=500", "open_runs=20_000", "backfills=2", "request_bytes=1MiB", "team-a:backfills=9"])
            .unwrap();
        let d = Quota::default();
        assert_eq!(q.of("team-a"), Quota { request_bytes: 1 << 20, open_runs: 500, backfills: 9, ..d });
        assert_eq!(q.of("other"), Quota { request_bytes: 1 << 20, open_runs: 20_000, backfills: 2, ..d });
        assert_eq!(Quotas::parse(&["team-b:open_bytes=1GiB"]).unwrap().of("team-b").open_bytes, 1 << 30);
        assert_eq!(q.namespaces().collect::<Vec<_>>(), ["team-a"]);
        assert_eq!(Quotas::parse::<&str>(&[]).unwrap().of("x"), Quota::default());
    }

    #[test]
    fn a_bad_value_is_refused_with_what_is_wrong() {
        for (spec, says) in [
            ("open_runs", "expected"),
            ("open_run=5", "unknown quota"),
            ("open_runs=-1", "whole number"),
            ("open_runs=0", "at least 1"),
            ("request_bytes=lots", "request_bytes"),
            ("Bad Name:open_runs=5", "namespace"),
            ("backlog=5", "unknown quota"),
        ] {
            let e = Quotas::parse(&[spec]).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }

    #[test]
    fn a_check_refuses_only_past_the_limit_and_says_by_how_much() {
        let q = Quota { open_runs: 10, ..Quota::default() };
        assert!(q.check("a", QuotaName::OpenRuns, 4, 6).is_ok(), "up to the limit fits");
        let e = q.check("a", QuotaName::OpenRuns, 4, 7).unwrap_err();
        assert_eq!((e.limit, e.usage, e.asked, e.quota), (10, 4, 7, QuotaName::OpenRuns));
        assert!(e.to_string().contains("open_runs"), "{e}");
        assert!(q.check("a", QuotaName::OpenRuns, u64::MAX, 1).is_err(), "no overflow");
    }
}
