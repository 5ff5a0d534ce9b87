//! What the API is shown of the namespaces.

use crate::fair::NsCounts;
use gnomon_core::backpressure::Pressure;

use crate::Engine;
use std::collections::BTreeMap;

/// One namespace's use of its quotas, as `GET /v1/namespaces/{namespace}/usage`
/// shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NamespaceUsage {
    pub namespace: String,
    /// Its own backpressure: `red` while its backlog defers its fires and
    /// pauses its backfills.
    pub pressure: Pressure,
    /// Its open runs, by state.
    pub runs: NsCounts,
    /// What counts against `open_runs`: its open runs, its keyed runs still
    /// held after they ended, and the instants its running backfills have
    /// still to create.
    pub open_runs: u64,
    /// Backfills running.
    pub backfills: u64,
    /// Its quotas.
    pub quota: gnomon_core::quota::Quota,
}

impl NamespaceUsage {
    /// A namespace that holds nothing, under `quota`.
    pub fn empty(quota: gnomon_core::quota::Quota) -> Self {
        Self { namespace: String::new(), pressure: Pressure::Green, runs: NsCounts::default(), open_runs: 0, backfills: 0, quota }
    }
}

impl Engine {
    /// Every namespace with open runs or running backfills.
    pub fn namespace_usage(&self) -> BTreeMap<String, NamespaceUsage> {
        let mut out = BTreeMap::new();
        let mut names: std::collections::BTreeSet<&str> = self.cache.runs.ns_tally().map(|(ns, _)| ns).collect();
        names.extend(self.cache.backfills.namespaces());
        for ns in names {
            let runs = self.cache.runs.ns_counts(ns);
            let (backfills, reserved) = self.cache.backfills.of_namespace(ns);
            let usage = NamespaceUsage {
                namespace: ns.to_string(),
                pressure: self.admission.state_of(ns),
                runs,
                open_runs: runs.counted() + reserved,
                backfills,
                quota: self.admission.quota(ns),
            };
            out.insert(ns.to_string(), usage);
        }
        out
    }
}
