//! The OpenAPI 3.1 description of the REST API, served at `/v1/openapi.json`.

use serde_json::{json, Value};

fn op(summary: &str, params: &[&str], body: Option<&str>, ok: (&str, &str)) -> Value {
    let mut o = json!({
        "summary": summary,
        "parameters": params.iter().map(|p| json!({"$ref": format!("#/components/parameters/{p}")})).collect::<Vec<_>>(),
        "responses": {
            ok.0: {"description": "success", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{}", ok.1)}}}},
            "4XX": {"$ref": "#/components/responses/Error"},
            "5XX": {"$ref": "#/components/responses/Error"},
        },
    });
    if let Some(schema) = body {
        o["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
    }
    o
}

pub fn document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {"title": "gnomon", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Distributed job scheduler: exactly-once firing per (job, scheduled_at), at-least-once execution."},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {
                "post": op("Create a job", &["namespace"], Some("JobSpec"), ("201", "Job")),
                "get": op("List jobs", &["namespace", "stale"], None, ("200", "JobList")),
            },
            "/v1/jobs/{name}": {
                "get": op("Get a job", &["name", "namespace", "stale"], None, ("200", "Job")),
                "put": op("Create or update a job (If-Match or ?version= for a precondition)", &["name", "namespace", "version"], Some("JobSpec"), ("200", "Job")),
                "delete": op("Delete a job", &["name", "namespace", "version"], None, ("204", "Empty")),
            },
            "/v1/jobs/{name}/trigger": {"post": op("Trigger a run now", &["name", "namespace"], None, ("201", "Run"))},
            "/v1/jobs/{name}/pause": {"post": op("Pause a job", &["name", "namespace"], None, ("200", "Job"))},
            "/v1/jobs/{name}/resume": {"post": op("Resume a job", &["name", "namespace"], None, ("200", "Job"))},
            "/v1/runs": {"get": op("List runs, newest first", &["job", "namespace", "state", "limit", "cursor", "stale"], None, ("200", "RunList"))},
            "/v1/runs/{id}": {"get": op("Get a run with its attempts", &["id", "stale"], None, ("200", "Run"))},
            "/v1/runs/{id}/cancel": {"post": op("Cancel a run (200 when cancelled, 202 when the leader is stopping its attempt)", &["id"], None, ("200", "Run"))},
            "/v1/workers": {"get": op("List worker sessions", &[], None, ("200", "WorkerList"))},
            "/v1/leader": {"get": op("Current leadership of the scheduler scope", &["stale"], None, ("200", "Leader"))},
            "/v1/cluster": {"get": op("The members of a raft:// cluster", &[], None, ("200", "Object"))},
            "/v1/cluster/learners": {"post": op("Add a learner ({\"id\", \"address\"}); answers once it has caught up", &[], Some("Object"), ("200", "Object"))},
            "/v1/cluster/members/{id}/promote": {"post": op("Make a learner a voter", &["id"], None, ("200", "Object"))},
            "/v1/cluster/members/{id}": {"delete": op("Remove a member", &["id"], None, ("200", "Object"))},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "parameters": {
                "name": {"name": "name", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"}},
                "id": {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
                "namespace": {"name": "namespace", "in": "query", "schema": {"type": "string", "default": "default"}},
                "version": {"name": "version", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                "job": {"name": "job", "in": "query", "schema": {"type": "string"}},
                "state": {"name": "state", "in": "query", "schema": {"$ref": "#/components/schemas/RunState"}},
                "limit": {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
                "cursor": {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                "stale": {"name": "stale", "in": "query", "description": "On a raft:// member: answer from this member's copy without confirming it is current (answers carry Gnomon-Read: stale)", "schema": {"type": "boolean", "default": false}},
            },
            "responses": {"Error": {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
            "schemas": {
                "Empty": {"type": "object"},
                "Object": {"type": "object"},
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
                "Duration": {"type": "string", "examples": ["30s", "5m", "250ms"]},
                "RunState": {"enum": ["pending", "assigned", "running", "retrying", "succeeded", "failed", "cancelled", "skipped"]},
                "JobSpec": {"type": "object", "additionalProperties": false, "required": ["name", "executor"], "properties": {
                    "name": {"type": "string"}, "namespace": {"type": "string"}, "description": {"type": "string"},
                    "schedule": {"type": "object", "additionalProperties": false, "properties": {
                        "cron": {"type": "string"}, "timezone": {"type": "string"}, "every": {"$ref": "#/components/schemas/Duration"}, "at": {"type": "string", "format": "date-time"}}},
                    "executor": {"oneOf": [
                        {"type": "object", "required": ["shell"], "properties": {"shell": {"type": "object", "required": ["command"], "properties": {
                            "command": {"type": "string"}, "args": {"type": "array", "items": {"type": "string"}},
                            "env": {"type": "object", "additionalProperties": {"type": "string"}}, "cwd": {"type": "string"},
                            "keep_workdir": {"type": "boolean"},
                            "limits": {"type": "object", "additionalProperties": false, "properties": {
                                "cpu_seconds": {"type": "integer", "minimum": 1}, "memory": {"type": "string", "example": "512MiB"},
                                "open_files": {"type": "integer", "minimum": 8}, "processes": {"type": "integer", "minimum": 1}}}}}}},
                        {"type": "object", "required": ["http"], "properties": {"http": {"type": "object", "required": ["url"], "properties": {
                            "method": {"type": "string"}, "url": {"type": "string"}, "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                            "body": {"type": "string"}, "expect_status": {"type": "integer"}}}}},
                        {"type": "object", "required": ["handler"], "properties": {"handler": {"type": "object", "required": ["name"], "properties": {
                            "name": {"type": "string"}, "payload": {}}}}}]},
                    "retry": {"type": "object", "properties": {"max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
                        "backoff": {"type": "object", "properties": {"initial": {"$ref": "#/components/schemas/Duration"}, "max": {"$ref": "#/components/schemas/Duration"},
                            "multiplier": {"type": "number"}, "jitter": {"type": "number"}}}}},
                    "timeout": {"$ref": "#/components/schemas/Duration"},
                    "overlap": {"enum": ["allow", "forbid", "replace", "buffer_one"]},
                    "misfire": {"enum": ["skip", "fire_once", "fire_all"]},
                    "catchup_window": {"$ref": "#/components/schemas/Duration"},
                    "route": {"type": "object", "properties": {"strategy": {"enum": ["least_loaded", "round_robin", "consistent_hash"]},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                    "status": {"description": "read-only; ignored on write"}}},
                "Job": {"allOf": [{"$ref": "#/components/schemas/JobSpec"}, {"type": "object", "properties": {"status": {"type": "object", "properties": {
                    "version": {"type": "integer"}, "paused": {"type": "boolean"}, "created_at": {"type": "string"}, "updated_at": {"type": "string"},
                    "last_scheduled_at": {"type": ["string", "null"]}, "next_fire_at": {"type": ["string", "null"]}}}}}]},
                "JobList": {"type": "object", "properties": {"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}}}},
                "Attempt": {"type": "object", "properties": {"attempt": {"type": "integer"}, "worker": {"type": "string"}, "token": {"type": "integer"},
                    "state": {"enum": ["assigned", "running", "succeeded", "failed", "timed_out", "lost", "cancelled"]},
                    "started_at": {"type": ["string", "null"]}, "ended_at": {"type": ["string", "null"]}, "exit_code": {"type": ["integer", "null"]}, "output": {"type": "string"}}},
                "Run": {"type": "object", "properties": {"id": {"type": "string"}, "job": {"type": "string"}, "namespace": {"type": "string"},
                    "scheduled_at": {"type": "string"}, "fired_at": {"type": "string"}, "state": {"$ref": "#/components/schemas/RunState"},
                    "attempt": {"type": "integer"}, "reason": {"type": ["string", "null"]}, "attempts": {"type": "array", "items": {"$ref": "#/components/schemas/Attempt"}}}},
                "RunList": {"type": "object", "properties": {"runs": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}}, "next_cursor": {"type": ["string", "null"]}}},
                "WorkerList": {"type": "object", "properties": {"workers": {"type": "array", "items": {"type": "object", "properties": {
                    "id": {"type": "string"}, "labels": {"type": "object"}, "capacity": {"type": "integer"}, "load": {"type": "integer"},
                    "state": {"type": "string"}, "lease_expires_at": {"type": ["string", "null"]}}}}}},
                "Leader": {"type": "object", "properties": {"scope": {"type": "string"}, "backend": {"type": "string"}, "holder": {"type": ["string", "null"]},
                    "token": {"type": ["integer", "null"]}, "address": {"type": ["string", "null"]}, "since": {"type": ["string", "null"]}, "is_self": {"type": "boolean"},
                    "leader_time": {"type": ["string", "null"], "description": "the committed leader time"},
                    "clock": {"type": "object", "description": "this server's clock against the leader time",
                        "properties": {"skew_ms": {"type": ["integer", "null"]}, "verdict": {"type": ["string", "null"], "enum": ["ok", "warn", "step_down", null]},
                            "stepped_down_at": {"type": ["string", "null"]}}}}},
            }
        }
    })
}
