//! Metrics: every metric a real server exports has HELP and TYPE lines,
//! every one it records is in the catalogue (`METRICS`), and the Grafana
//! dashboard and Prometheus alert rules under `deploy/` name only metrics
//! of the catalogue.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use gnomon_server::metrics_setup::{Kind, METRICS};
use serde_json::json;

/// The `gnomon_…` names in `text`, histogram series folded to their family.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("gnomon_") {
        if i > 0 && (text.as_bytes()[i - 1].is_ascii_alphanumeric() || text.as_bytes()[i - 1] == b'_') {
            continue;
        }
        let name: String = text[i..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit()).collect();
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name).to_string();
        out.insert(family);
    }
    out
}

fn catalogue() -> BTreeSet<String> {
    METRICS.iter().map(|(n, _, _)| n.to_string()).collect()
}

#[test]
fn dashboards_and_alerts_name_only_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let known = catalogue();
    let mut named = 0;
    for file in ["grafana/gnomon.json", "prometheus/alerts.yml"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let names = metric_names(&text);
        assert!(!names.is_empty(), "{file} names metrics");
        for n in &names {
            assert!(known.contains(n), "{file} names {n}, which gnomon does not export");
        }
        named += names.len();
    }
    assert!(named >= 15, "the dashboard and alerts cover the metrics");
    // Histograms are the only metrics with `_bucket` series.
    for (name, kind, help) in METRICS {
        assert!(!help.is_empty() && name.starts_with("gnomon_"));
        assert_eq!(name.ends_with("_total"), *kind == Kind::Counter, "{name}: counters, and only they, end in _total");
    }
}

#[test]
fn every_exported_metric_has_help_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, addr) = leading_dev(dir.path());
    // Some work, so that the run and dispatch metrics are recorded.
    let job = json!({"name": "m", "schedule": {"every": "1s"}, "executor": {"shell": {"command": "true"}}});
    assert_eq!(http(&addr, "POST", "/v1/jobs", Some(&serde_json::to_vec(&job).unwrap())).unwrap().0, 201);
    wait_until("a scheduled run to end", Duration::from_secs(60), || {
        http(&addr, "GET", "/v1/runs?job=m&state=succeeded", None)
            .map(|(_, v)| v["runs"].as_array().is_some_and(|r| !r.is_empty()))
            .unwrap_or(false)
    });
    let text = get_metrics(&addr);
    let exported = metric_names(&text);
    assert!(exported.len() >= 15, "a working server exports most metrics: {exported:?}");
    let known = catalogue();
    for name in &exported {
        assert!(known.contains(name), "{name} is exported but not in the catalogue (METRICS)");
        assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP line");
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} has no TYPE line");
    }
    for name in ["gnomon_runs_total", "gnomon_fire_lateness_seconds", "gnomon_is_leader", "gnomon_fencing_rejections_total"] {
        assert!(exported.contains(name), "{name} is exported");
    }
}

fn get_metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
