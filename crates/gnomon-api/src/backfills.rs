//! Backfills: the runs of a job's past instants, created by the leader at
//! a bounded rate.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a backfill is asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    /// The first instant of the range (RFC 3339), included.
    #[schema(value_type = gnomon_core::schema::Instant)]
    pub from: String,
    /// The last instant of the range (RFC 3339), included; not before
    /// `from`. One still to come is cut to the time the backfill is asked
    /// for (the future is the schedule's); the answer shows the cut.
    #[schema(value_type = gnomon_core::schema::Instant)]
    pub to: String,
    /// Values of the job's params for every run it creates (the others
    /// keep their defaults); each must be a param the job declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::BTreeMap<gnomon_core::schema::ParamName, gnomon_core::schema::ParamValue>>)]
    pub params: Option<gnomon_core::params::Params>,
    /// Instants per second (1 to 1000; default 10).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "gnomon_core::int::option")]
    #[schema(minimum = 1, maximum = 1000)]
    pub rate: Option<u32>,
}

/// A backfill and how far it has come.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Backfill {
    /// Its id (`<job uid>-b<when it was asked for>`).
    pub id: String,
    /// The job's namespace.
    pub namespace: String,
    /// The job.
    pub job: String,
    /// The range's first instant, included…
    pub from: String,
    /// …and its last, included.
    pub to: String,
    /// The values its runs record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub params: Option<serde_json::Value>,
    /// Instants per second.
    pub rate: u32,
    /// `running`, `done` or `cancelled`.
    pub state: String,
    /// How many instants the range holds…
    pub total: u64,
    /// …how many got a run from it…
    pub created: u64,
    /// …and how many had a run or a skip record already (kept as it was).
    pub kept: u64,
    /// The last instant handled, once one is.
    pub cursor: Option<String>,
    /// Why it ended.
    pub reason: Option<String>,
    /// When it was asked for.
    pub created_at: String,
    /// When it last moved (or ended).
    pub updated_at: String,
}

/// Backfills, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BackfillList {
    /// At most 1000.
    pub backfills: Vec<Backfill>,
}
