//! Property tests of the job parser: whatever the bytes, `parse_job_json`
//! and `compile` answer with a job or a coded error, never a panic; and a
//! job that parses and compiles survives a round trip through JSON.

use gnomon_core::spec::parse_job_json;
use proptest::prelude::*;

/// JSON-shaped text built from job-like pieces, so the parser gets past
/// the first byte often.
fn jobish() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "name",
        "namespace",
        "schedule",
        "cron",
        "every",
        "at",
        "timezone",
        "timeout",
        "retry",
        "max_attempts",
        "backoff",
        "initial",
        "max",
        "jitter",
        "executor",
        "shell",
        "command",
        "args",
        "env",
        "cwd",
        "limits",
        "memory",
        "http",
        "url",
        "handler",
        "payload",
        "misfire",
        "overlap",
        "catchup_window",
        "keep_workdir",
        "bogus",
    ]);
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:e}")),
        Just("null".to_string()),
        Just("true".to_string()),
        "[a-z0-9 */:.,-]{0,20}".prop_map(|s| format!("{s:?}")),
        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just("\"\\ud800\"".to_string()),
        Just("1e400".to_string()),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| format!("{{{}}}", kv.iter().map(|(k, v)| format!("{k:?}:{v}")).collect::<Vec<_>>().join(","))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(e) = parse_job_json(&bytes) {
            prop_assert!(!e.code.is_empty());
        }
    }

    #[test]
    fn job_shaped_json_parses_or_says_why(text in jobish()) {
        match parse_job_json(text.as_bytes()) {
            Err(e) => prop_assert!(!e.code.is_empty() && !e.message.is_empty()),
            Ok(spec) => {
                if let Ok(compiled) = spec.compile() {
                    let again = serde_json::to_vec(&compiled.spec).unwrap();
                    let back = parse_job_json(&again).expect("a compiled job re-parses");
                    prop_assert_eq!(back.compile().expect("and re-compiles").spec, compiled.spec);
                }
            }
        }
    }
}
