//! The OpenAPI 3.1 document of the REST API, served at `/v1/openapi.json`:
//! generated from the handlers' annotations and the `gnomon-api` types the
//! handlers answer with, so it describes what the server really sends.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api::{backfills, hooks, jobs, runs, status, trigger};
use crate::cluster_api;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "gnomon",
        description = "Distributed job scheduler: exactly-once firing per (job, scheduled time), at-least-once execution. \
            Every error is {\"error\": {\"code\", \"message\"}}. Calls need a bearer credential when the server has any \
            (viewer: reads; operator: triggers, pause, resume, cancel; admin: jobs and the cluster)."
    ),
    paths(
        jobs::create_job, jobs::list_jobs, jobs::get_job, jobs::put_job,
        jobs::delete_job, trigger::trigger_job, jobs::pause_job, jobs::resume_job,
        jobs::preview_schedule, hooks::hook,
        backfills::create_backfill, backfills::list_backfills, backfills::get_backfill, backfills::cancel_backfill,
        runs::list_runs, runs::get_run, runs::cancel_run,
        status::list_workers, status::whoami, status::leader, status::healthz, status::readyz,
        cluster_api::status, cluster_api::add_learner, cluster_api::promote, cluster_api::remove,
    ),
    components(schemas(gnomon_api::ErrorBody, gnomon_api::TriggerAnswer, gnomon_core::schema::JobUpdate)),
    modifiers(&Bearer),
    tags(
        (name = "jobs", description = "Jobs, manual triggers and schedule previews"),
        (name = "hooks", description = "Webhook calls that start runs, signed with the job's secret instead of a credential"),
        (name = "runs", description = "Runs and their attempts"),
        (name = "backfills", description = "Backfills of past instants and their progress"),
        (name = "cluster", description = "Leadership, workers and raft members"),
        (name = "operations", description = "Probes"),
    )
)]
struct Doc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
        doc.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new("bearer", Vec::<String>::new())]);
    }
}

/// The document, as JSON.
pub fn document() -> serde_json::Value {
    let mut doc = Doc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut value = serde_json::to_value(doc).unwrap_or_default();
    if let Some(serde_json::Value::Object(schemas)) = value.pointer_mut("/components/schemas") {
        gnomon_core::schema::refine(schemas);
    }
    value
}
