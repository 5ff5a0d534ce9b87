//! The `http` executor: one request through the worker's egress-checked
//! client, the status and a bounded body as the outcome.

use super::*;

pub(super) async fn run_http(req: &ExecRequest, spec: &HttpSpec, http: &reqwest::Client) -> ExecOutcome {
    let method = match reqwest::Method::from_bytes(spec.method.as_bytes()) {
        Ok(m) => m,
        Err(e) => return ExecOutcome::failed(format!("bad method: {e}")),
    };
    match reqwest::Url::parse(&spec.url) {
        Ok(url) => {
            if let Err(e) = req.egress.check_url(&url) {
                return ExecOutcome::failed(format!("request refused: {e}"));
            }
        }
        Err(e) => return ExecOutcome::failed(format!("bad url: {e}")),
    }
    let mut builder = http.request(method, &spec.url).timeout(req.timeout.unwrap_or(crate::egress::DEFAULT_TOTAL_TIMEOUT));
    for (k, v) in &spec.headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    for (k, v) in req.gnomon_vars() {
        let name = format!("Gnomon-{}", k.split('_').map(title).collect::<Vec<_>>().join("-"));
        builder = builder.header(name, v);
    }
    match (&spec.body, &req.payload, &req.params) {
        (Some(body), _, _) => builder = builder.body(body.clone()),
        // A job without a body of its own is sent its run's payload, as the
        // webhook call brought it, or else its params.
        (None, Some(payload), _) => {
            let json = serde_json::from_str::<serde::de::IgnoredAny>(payload).is_ok();
            let kind = if json { "application/json" } else { "text/plain; charset=utf-8" };
            builder = builder.header(reqwest::header::CONTENT_TYPE, kind).body(payload.clone());
        }
        (None, None, Some(params)) => {
            builder =
                builder.header(reqwest::header::CONTENT_TYPE, "application/json").body(serde_json::to_vec(params).unwrap_or_default());
        }
        (None, None, None) => {}
    }
    let response = match builder.send().await {
        Ok(r) => r,
        Err(e) => return ExecOutcome::failed(format!("request failed: {}", crate::error_chain(&e))),
    };
    let status = response.status().as_u16();
    let mut tail = OutputTail::default();
    let mut response = response;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => tail.push(&chunk),
            Ok(None) => break,
            Err(e) => {
                tail.push(format!("\n[gnomon: body read failed: {e}]").as_bytes());
                break;
            }
        }
    }
    let ok = match spec.expect_status {
        Some(expected) => status == expected,
        None => (200..300).contains(&status),
    };
    ExecOutcome {
        state: if ok { AttemptState::Succeeded } else { AttemptState::Failed },
        exit_code: Some(i32::from(status)),
        output: tail.into_string(),
        retry: Default::default(),
    }
}

fn title(word: &str) -> String {
    let lower = word.to_ascii_lowercase();
    let mut chars = lower.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}
