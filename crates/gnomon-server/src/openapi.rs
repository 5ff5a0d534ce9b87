//! The OpenAPI 3.1 document of the REST API, served at `/v1/openapi.json`:
//! generated from the handlers' annotations and the `gnomon-api` types the
//! handlers answer with, so it describes what the server really sends.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api::{backfills, hooks, jobs, output, runs, status, trigger, usage, workers};
use crate::cluster_api;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "gnomon",
        description = "Distributed job scheduler: exactly-once firing per (job, scheduled time), at-least-once execution. \
            Every error is {\"error\": {\"code\", \"message\"}}. Calls need a bearer credential when the server has any \
            (viewer: reads; operator: triggers, pause, resume, cancel; admin: jobs, the cluster and worker ids)."
    ),
    paths(
        jobs::create_job, jobs::list_jobs, jobs::get_job, jobs::put_job,
        jobs::delete_job, trigger::trigger_job, jobs::pause_job, jobs::resume_job,
        jobs::preview_schedule, hooks::hook,
        backfills::create_backfill, backfills::list_backfills, backfills::get_backfill, backfills::cancel_backfill,
        runs::list_runs, runs::get_run, output::run_output, runs::cancel_run,
        status::list_workers, workers::release_worker,
        usage::list_usage, usage::get_usage, status::whoami, status::leader, status::healthz, status::readyz,
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    /// The schema of one parameter of one operation.
    fn param<'a>(doc: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
        let params = doc["paths"][path][method]["parameters"].as_array().unwrap();
        &params.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{method} {path} has no {name}"))["schema"]
    }

    #[test]
    fn the_limits_the_handlers_check_are_the_documents() {
        let doc = super::document();
        let trigger = "/v1/jobs/{name}/trigger";
        assert_eq!(param(&doc, trigger, "post", "count")["maximum"], json!(crate::api::MAX_TRIGGER_COUNT));
        for (path, method) in [(trigger, "post"), ("/v1/hooks/{namespace}/{job}", "post")] {
            let key = param(&doc, path, method, "Idempotency-Key");
            assert_eq!(key["maxLength"], json!(crate::api::trigger::MAX_IDEMPOTENCY_KEY), "{path}");
            assert_eq!(key["pattern"], json!(gnomon_core::schema::IDEMPOTENCY_KEY_PATTERN), "{path}");
        }
        let schemas = &doc["components"]["schemas"];
        assert_eq!(schemas["BackfillRequest"]["properties"]["rate"]["maximum"], json!(crate::api::backfills::MAX_BACKFILL_RATE));
        assert_eq!(schemas["SchedulePreviewRequest"]["properties"]["count"]["maximum"], json!(gnomon_core::preview::MAX_PREVIEW));
        // The job writes that honour If-Match declare it.
        for method in ["put", "delete"] {
            assert!(param(&doc, "/v1/jobs/{name}", method, "If-Match")["pattern"].is_string());
        }
        // No status range: every status an operation answers is listed.
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for status in op["responses"].as_object().unwrap().keys() {
                    assert!(status.parse::<u16>().is_ok(), "{method} {path} lists the range {status}");
                }
            }
        }
    }
}
