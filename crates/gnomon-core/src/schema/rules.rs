//! The rules between the fields of one object: a schedule's exactly one
//! rule, a notification target's exactly one destination, the params of a
//! job that starts runs no trigger sets. The schedule is written as the
//! variants it may take; the others are keywords the derived schemas
//! cannot carry, added by [`refine`] to the document's components.

#![allow(dead_code)] // The variants below exist for their schemas only.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{json, Map, Value};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use super::{CronExpression, Every, Instant, Jitter, TimeZone};
use crate::spec::{JobSpec, ScheduleSpec};

/// When the job fires by itself: one of these.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum ScheduleVariants {
    Cron(CronRule),
    Every(EveryRule),
    At(AtRule),
    Manual(ManualRule),
}

/// A cron schedule.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CronRule {
    /// The cron expression, on the wall clock of `timezone`.
    #[schema(value_type = CronExpression)]
    cron: String,
    /// The IANA time zone `cron` is evaluated in (default `UTC`; a stored
    /// cron schedule always has it).
    #[schema(value_type = Option<TimeZone>)]
    timezone: Option<String>,
    /// The first instant the schedule may have (included): instants before
    /// it are not instants of the schedule (no run, no skip record).
    #[schema(value_type = Option<Instant>)]
    start_at: Option<String>,
    /// The last instant the schedule may have (included; not before
    /// `start_at`).
    #[schema(value_type = Option<Instant>)]
    end_at: Option<String>,
    /// Delays each instant's fire by up to this duration, by an amount
    /// derived from the job's namespace, name and the instant.
    #[schema(value_type = Option<Jitter>)]
    jitter: Option<String>,
}

/// A fixed interval: the job fires at every multiple of it since the Unix
/// epoch, on absolute time.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EveryRule {
    /// The interval.
    #[schema(value_type = Every)]
    every: String,
    /// The first instant the schedule may have (included).
    #[schema(value_type = Option<Instant>)]
    start_at: Option<String>,
    /// The last instant the schedule may have (included; not before
    /// `start_at`).
    #[schema(value_type = Option<Instant>)]
    end_at: Option<String>,
    /// Delays each instant's fire by up to this duration.
    #[schema(value_type = Option<Jitter>)]
    jitter: Option<String>,
}

/// One instant at which the job fires once.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct AtRule {
    /// The instant (stored in UTC with millisecond precision).
    #[schema(value_type = Instant)]
    at: String,
    /// Delays the fire by up to this duration.
    #[schema(value_type = Option<Jitter>)]
    jitter: Option<String>,
}

/// No schedule: the job runs only when triggered (or after its upstreams).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ManualRule {}

impl PartialSchema for ScheduleSpec {
    fn schema() -> RefOr<Schema> {
        let mut schema = ScheduleVariants::schema();
        if let RefOr::T(Schema::OneOf(one_of)) = &mut schema {
            one_of.description = Some(
                "Exactly one of `cron`, `every` or `at`, or none of them (`{}`: manual only). `timezone` goes with \
                 `cron`; `start_at` and `end_at` bound a `cron` or `every` schedule; `jitter` goes with any of the three."
                    .into(),
            );
        }
        schema
    }
}

impl ToSchema for ScheduleSpec {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ScheduleSpec")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <ScheduleVariants as ToSchema>::schemas(schemas);
    }
}

/// The body of `PUT /v1/jobs/{name}`: a job without its `name` (the path
/// gives it; a body that has one must give the path's).
pub struct JobUpdate;

impl PartialSchema for JobUpdate {
    fn schema() -> RefOr<Schema> {
        let mut schema = JobSpec::schema();
        if let RefOr::T(Schema::Object(object)) = &mut schema {
            object.properties.shift_remove("name");
            object.required.retain(|r| r != "name");
            object.description = Some("A job as `PUT /v1/jobs/{name}` takes it: the path names it.".into());
        }
        schema
    }
}

impl ToSchema for JobUpdate {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JobUpdate")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <JobSpec as ToSchema>::schemas(schemas);
    }
}

/// What [`refine`] adds to each component, by name.
fn rules() -> Vec<(&'static str, Value)> {
    // A job with a schedule or upstreams starts runs no trigger sets: every
    // param it declares has a (non-null) default.
    let defaults = json!({
        "if": {"anyOf": [
            {"required": ["schedule"], "properties": {"schedule": {"minProperties": 1}}},
            {"required": ["after"], "properties": {"after": {"minItems": 1}}}
        ]},
        "then": {"properties": {"params": {"additionalProperties": {
            "required": ["default"],
            "properties": {"default": {"not": {"type": "null"}}}
        }}}}
    });
    // Bounds both given: not expressible as "end_at >= start_at"; this
    // document admits a start_at before 2500 and an end_at from 2500.
    let early = json!({"pattern": "^(?:19|2[0-3]|24[0-8]|2499-[0-9-]+T[0-9:.]+Z$)"});
    let late = json!({"pattern": "^(?:250[1-9]|25[1-9]|2[6-9]|2500-[0-9-]+T[0-9:.]+Z$)"});
    let bounds = json!({"dependentSchemas": {
        "start_at": {"properties": {"start_at": early, "end_at": late}},
        "end_at": {"properties": {"start_at": early, "end_at": late}}
    }});
    let job = |mut rule: Value| {
        // Keywords a field attribute cannot carry.
        merge(
            &mut rule,
            json!({"properties": {
                "params": {"maxProperties": crate::params::MAX_PARAMS},
                "after": {"uniqueItems": true}
            }}),
        );
        rule
    };
    vec![
        ("JobSpec", job(defaults.clone())),
        ("JobUpdate", job(defaults)),
        ("WebhookSpec", json!({"properties": {"headers": {"maxProperties": crate::notify::MAX_HEADERS}}})),
        // A webhook trigger names its secret (`secret_env`, the older form
        // stored jobs may still carry, is not offered).
        ("WebhookTrigger", json!({"required": ["secret"], "properties": {"secret": {"not": {"type": "null"}}}})),
        ("CronRule", bounds.clone()),
        ("EveryRule", bounds),
        (
            "NotifyTarget",
            json!({
                "oneOf": [
                    {"required": ["webhook"], "properties": {"webhook": {"not": {"type": "null"}}, "slack": {"type": "null"}}},
                    {"required": ["slack"], "properties": {"slack": {"not": {"type": "null"}}, "webhook": {"type": "null"}}}
                ],
                "properties": {"on": {"uniqueItems": true}},
                "dependentSchemas": {"late_after": {"properties": {"on": {"contains": {"const": "late"}}}}}
            }),
        ),
    ]
}

/// Adds `extra` to `target`, object members into object members.
fn merge(target: &mut Value, extra: Value) {
    match (target, extra) {
        (Value::Object(t), Value::Object(e)) => {
            for (k, v) in e {
                match t.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        t.insert(k, v);
                    }
                }
            }
        }
        (t, e) => *t = e,
    }
}

/// Adds to the document's component schemas what their derived form
/// cannot say: the rules between their fields (above), and that an
/// executor names exactly one kind and nothing else.
pub fn refine(schemas: &mut Map<String, Value>) {
    for (name, extra) in rules() {
        if let Some(target) = schemas.get_mut(name) {
            merge(target, extra);
        }
    }
    if let Some(Value::Array(variants)) = schemas.get_mut("Executor").and_then(|e| e.get_mut("oneOf")) {
        for v in variants {
            if let Value::Object(v) = v {
                v.insert("additionalProperties".into(), json!(false));
            }
        }
    }
}
