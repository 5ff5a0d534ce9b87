//! Each pattern against the validation it stands for: every string a
//! pattern admits (drawn from near its edges) is accepted where the server
//! checks it, and normalises to a string the pattern admits again; the
//! numbers in the schemas are the constants the validation uses.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use regex::Regex;
use serde_json::{json, Value};
use utoipa::PartialSchema;

use super::*;
use crate::duration::{format_duration, parse_duration};
use crate::spec::parse_job_json;

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"))
}

fn compiles(job: Value) -> Result<(), String> {
    parse_job_json(job.to_string().as_bytes()).and_then(|s| s.compile()).map(|_| ()).map_err(|e| format!("{job}: {e}"))
}

fn job(extra: Value) -> Value {
    let mut j = json!({"name": "j", "executor": {"handler": {"name": "noop"}}});
    for (k, v) in extra.as_object().unwrap() {
        j[k] = v.clone();
    }
    j
}

/// A duration's components in humantime order, each present or not, with
/// values around their limits.
fn random_duration(rng: &mut StdRng) -> String {
    let units = [("month", 12), ("day", 31), ("h", 24), ("m", 60), ("s", 60), ("ms", 1000)];
    let mut out = String::new();
    for (unit, limit) in units {
        if rng.gen_bool(0.4) {
            let n: u32 = if rng.gen_bool(0.5) { rng.gen_range(0..=limit) } else { limit - rng.gen_range(0..3).min(limit) };
            let plural = if (unit == "month" || unit == "day") && n != 1 { "s" } else { "" };
            out.push_str(&format!("{n}{unit}{plural}"));
        }
    }
    out
}

#[test]
fn each_duration_pattern_admits_only_values_its_field_accepts_and_their_normal_form() {
    let mut rng = StdRng::seed_from_u64(7);
    type JobWith = Box<dyn Fn(&str) -> Value>;
    let kinds: [(&str, String, JobWith); 8] = [
        ("timeout", duration_pattern(), Box::new(|d| job(json!({"timeout": d})))),
        (
            "catchup",
            minute_or_more_pattern(),
            Box::new(|d| job(json!({"catchup_window": d, "schedule": {"every": "1h", "jitter": "59s999ms"}}))),
        ),
        ("every", every_pattern(), Box::new(|d| job(json!({"schedule": {"every": d}})))),
        ("jitter", under_minute_pattern(), Box::new(|d| job(json!({"catchup_window": "1m", "schedule": {"every": "1s", "jitter": d}})))),
        ("initial", up_to_minute_pattern(), Box::new(|d| job(json!({"retry": {"backoff": {"initial": d, "max": "1m"}}})))),
        ("max", minute_or_more_pattern(), Box::new(|d| job(json!({"retry": {"backoff": {"initial": "1m", "max": d}}})))),
        (
            "late_after",
            late_after_pattern(),
            Box::new(|d| job(json!({"notify": [{"on": ["late"], "slack": {"url": "http://h/"}, "late_after": d}]}))),
        ),
        (
            "delivery",
            delivery_timeout_pattern(),
            Box::new(|d| job(json!({"notify": [{"on": ["failed"], "slack": {"url": "http://h/"}, "timeout": d}]}))),
        ),
    ];
    for (kind, pattern, job_with) in &kinds {
        let re = re(pattern);
        let mut admitted = 0;
        for _ in 0..20_000 {
            let text = random_duration(&mut rng);
            if !re.is_match(&text) {
                continue;
            }
            admitted += 1;
            compiles(job_with(&text)).unwrap_or_else(|e| panic!("{kind}: {text:?} is admitted but refused: {e}"));
            let normal = format_duration(parse_duration(&text).unwrap());
            assert!(re.is_match(&normal), "{kind}: {text:?} normalises to {normal:?}, which the pattern refuses");
        }
        assert!(admitted > 100, "{kind}: the pattern admits too little ({admitted})");
    }
    for (text, pattern) in [("30s", duration_pattern()), ("1m30s", duration_pattern()), ("1day12h", minute_or_more_pattern())] {
        assert!(re(&pattern).is_match(text), "{text}");
    }
}

#[test]
fn the_instant_pattern_admits_only_rfc3339_instants_that_stay_in_it_in_utc() {
    let mut rng = StdRng::seed_from_u64(11);
    let re = re(&instant_pattern());
    let mut admitted = 0;
    for _ in 0..200_000 {
        let year = if rng.gen_bool(0.3) { [1969, 1970, 1971, 2998, 2999, 3000][rng.gen_range(0..6)] } else { rng.gen_range(1965..3005) };
        let offset = match rng.gen_range(0..3) {
            0 => "Z".to_string(),
            _ => format!("{}{:02}:{:02}", if rng.gen_bool(0.5) { '+' } else { '-' }, rng.gen_range(0..25), rng.gen_range(0..61)),
        };
        let fraction = if rng.gen_bool(0.3) { format!(".{}", rng.gen_range(0..1_000_000)) } else { String::new() };
        let text = format!(
            "{year:04}-{:02}-{:02}T{:02}:{:02}:{:02}{fraction}{offset}",
            rng.gen_range(0..14),
            rng.gen_range(0..32),
            rng.gen_range(0..25),
            rng.gen_range(0..61),
            rng.gen_range(0..61)
        );
        if !re.is_match(&text) {
            continue;
        }
        admitted += 1;
        let t = chrono::DateTime::parse_from_rfc3339(&text).unwrap_or_else(|e| panic!("{text:?} is admitted but refused: {e}"));
        let normal = crate::format_millis(t.timestamp_millis());
        assert!(re.is_match(&normal), "{text:?} normalises to {normal:?}, which the pattern refuses");
    }
    assert!(admitted > 10_000, "{admitted}");
    assert!(re.is_match("2024-02-29T12:00:00+01:00") && !re.is_match("2023-02-29T12:00:00Z") && !re.is_match("1990-02-29T00:00:00Z"));
}

#[test]
fn the_cron_pattern_admits_only_expressions_that_fire() {
    let mut rng = StdRng::seed_from_u64(13);
    let re = re(&cron_pattern());
    let field = |rng: &mut StdRng, max: u32| match rng.gen_range(0..3) {
        0 => "*".to_string(),
        1 => rng.gen_range(0..=max + 1).to_string(),
        _ => format!("*/{}", rng.gen_range(0..=max + 1)),
    };
    let mut admitted = 0;
    for _ in 0..20_000 {
        let mut fields = vec![field(&mut rng, 31), field(&mut rng, 12), field(&mut rng, 7)];
        fields.insert(0, field(&mut rng, 24));
        fields.insert(0, field(&mut rng, 60));
        if rng.gen_bool(0.5) {
            fields.insert(0, field(&mut rng, 60));
        }
        let text = fields.join(" ");
        if re.is_match(&text) {
            admitted += 1;
            crate::schedule::CronSchedule::parse(&text, "UTC").unwrap_or_else(|e| panic!("{text:?} is admitted but refused: {e}"));
        }
    }
    assert!(admitted > 1000, "{admitted}");
    for m in ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly"] {
        assert!(re.is_match(m));
        crate::schedule::CronSchedule::parse(m, "UTC").unwrap();
    }
    let zones = serde_json::to_value(TimeZone::schema()).unwrap();
    for zone in zones["enum"].as_array().unwrap() {
        crate::schedule::CronSchedule::parse("0 * * * *", zone.as_str().unwrap()).unwrap();
    }
}

#[test]
fn sizes_urls_and_names_admitted_are_accepted() {
    let mut rng = StdRng::seed_from_u64(17);
    let memory = re(MEMORY_PATTERN);
    for _ in 0..5_000 {
        let digits = rng.gen_range(1..21);
        let n: String = (0..digits).map(|_| char::from(b'0' + rng.gen_range(0..10))).collect();
        let unit = ["", "k", "KiB", "M", "mb", "MiB", "G", "gib", "T", "TiB", "tb", "B", "x"][rng.gen_range(0..13)];
        let text = format!("{n}{unit}");
        if memory.is_match(&text) {
            compiles(job(json!({"executor": {"shell": {"command": "true", "limits": {"memory": text}}}}))).unwrap();
        }
    }
    let url = re(&url_pattern());
    let parts = [
        "http://", "https://", "ftp://", "a", "b-1", "9", "-", ".", "255", "256", ":80", ":0", ":65535", ":65536", "/", "/x%zz", "?q=1",
        "xn--",
    ];
    for _ in 0..20_000 {
        let text: String = (0..rng.gen_range(1..8)).map(|_| parts[rng.gen_range(0..parts.len())]).collect();
        if url.is_match(&text) {
            compiles(job(json!({"executor": {"http": {"url": text}}, "notify": [{"on": ["failed"], "webhook": {"url": text}}]}))).unwrap();
        }
    }
    let name = re(NAME_PATTERN);
    let chars = ['a', 'Z', '0', '_', '.', '-', '/', ' ', 'é'];
    for _ in 0..5_000 {
        let text: String = (0..rng.gen_range(0..6)).map(|_| chars[rng.gen_range(0..chars.len())]).collect();
        assert_eq!(name.is_match(&text), crate::spec::validate_name("name", &text, 128).is_ok(), "{text:?}");
    }
}

const HEADER_CHARS: &str = "-abcdeghlmnoprstxyzABCDEGHLMNOPRSTXYZ";

#[test]
fn avoiding_refuses_exactly_the_words_and_prefixes() {
    let mut rng = StdRng::seed_from_u64(19);
    let env = re(&avoiding(Alphabet::Except("=\0"), &[], &["GNOMON_"], false));
    let header = re(&avoiding(Alphabet::Only(HEADER_CHARS), &["host", "content-type"], &["gnomon-"], true));
    let env_chars = ['G', 'N', 'O', 'M', '_', '=', '\0', 'a'];
    let header_chars = ['g', 'G', 'n', 'o', 'm', '-', 'h', 's', 't', 'c', 'e', 'y', 'p', 'x', 'H', 'O', 'N', 'M'];
    for _ in 0..50_000 {
        let text: String = (0..rng.gen_range(0..10)).map(|_| env_chars[rng.gen_range(0..env_chars.len())]).collect();
        let ok = !text.is_empty() && !text.contains(['=', '\0']) && !text.starts_with("GNOMON_");
        assert_eq!(env.is_match(&text), ok, "{text:?}");
        let text: String = (0..rng.gen_range(0..14)).map(|_| header_chars[rng.gen_range(0..header_chars.len())]).collect();
        let lower = text.to_ascii_lowercase();
        let token = !text.is_empty() && text.chars().all(|c| HEADER_CHARS.contains(c));
        let ok = token && lower != "host" && lower != "content-type" && !lower.starts_with("gnomon-");
        assert_eq!(header.is_match(&text), ok, "{text:?}");
    }
}

#[test]
fn the_schemas_state_the_validation_constants() {
    let schema = |s: utoipa::openapi::RefOr<utoipa::openapi::Schema>| serde_json::to_value(s).unwrap();
    let spec = schema(crate::spec::JobSpec::schema());
    assert_eq!(spec["properties"]["description"]["maxLength"], json!(crate::spec::MAX_DESCRIPTION_LEN));
    assert_eq!(spec["properties"]["notify"]["maxItems"], json!(crate::notify::MAX_TARGETS));
    assert_eq!(spec["properties"]["after"]["maxItems"], json!(crate::deps::MAX_UPSTREAMS));
    let retry = schema(crate::spec::RetrySpec::schema());
    assert_eq!(retry["properties"]["max_attempts"]["maximum"], json!(crate::spec::MAX_ATTEMPTS_LIMIT));
    let param = schema(crate::params::ParamSpec::schema());
    assert_eq!(param["properties"]["description"]["maxLength"], json!(crate::params::MAX_PARAM_DESCRIPTION));
    let target = schema(crate::notify::NotifyTarget::schema());
    assert_eq!(target["properties"]["max_attempts"]["maximum"], json!(crate::notify::MAX_ATTEMPTS));
    let hook = schema(crate::triggers::WebhookTrigger::schema());
    assert_eq!(hook["properties"]["tolerance_seconds"]["maximum"], json!(crate::triggers::MAX_TOLERANCE_SECONDS));
    // The byte limits the trigger checks itself.
    let hook_job = |secret: &str, pointer: &str| {
        compiles(job(json!({"params": {"p": {}}, "triggers": {"webhook": {"secret": secret, "params": {"p": pointer}}}})))
    };
    assert!(hook_job(&"A".repeat(64), "/a").is_ok() && hook_job(&"A".repeat(65), "/a").is_err());
    let pointer = |n: usize| format!("/{}", "a".repeat(n - 1));
    assert!(hook_job("deploy", &pointer(MAX_POINTER_LEN)).is_ok() && hook_job("deploy", &pointer(MAX_POINTER_LEN + 1)).is_err());
    // Characters, not bytes.
    assert!(compiles(job(json!({"description": "é".repeat(crate::spec::MAX_DESCRIPTION_LEN)}))).is_ok());
    assert!(compiles(job(json!({"description": "é".repeat(crate::spec::MAX_DESCRIPTION_LEN + 1)}))).is_err());
}
