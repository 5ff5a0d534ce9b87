//! The crate's own checks of fences, table and step names, and recorded
//! results.

use crate::dialect::Tables;
use crate::fence::{check_fence, newer};
use crate::step::{check_step, recorded};
use crate::{fence_from_headers, Fence, FenceError, FenceParseError, Step};

fn f(attempt: u32, token: u64) -> Fence {
    Fence { run_id: "r".into(), attempt, token }
}

#[test]
fn a_higher_attempt_or_the_same_attempt_with_a_higher_token_is_newer() {
    let me = f(2, 5);
    assert!(!newer(&me, 2, 5), "the same attempt again");
    assert!(!newer(&me, 1, 5));
    assert!(!newer(&me, 1, 9), "an older attempt, whatever its token");
    assert!(!newer(&me, 2, 4));
    assert!(newer(&me, 3, 0));
    assert!(newer(&me, 2, 6));
    assert!(!newer(&f(1, u64::MAX), 1, i64::MAX), "tokens past i64 are the largest");
}

#[test]
fn fences_are_read_from_headers_and_refused_when_malformed() {
    let mut h = http::HeaderMap::new();
    h.insert("Gnomon-Run-Id", "abc-1000".parse().unwrap());
    h.insert("Gnomon-Attempt", "2".parse().unwrap());
    assert!(matches!(fence_from_headers(&h), Err(FenceError::Parse(FenceParseError::Missing(_)))));
    h.insert("Gnomon-Fence-Token", "x".parse().unwrap());
    assert!(matches!(fence_from_headers(&h), Err(FenceError::Parse(FenceParseError::Invalid(_)))));
    h.insert("Gnomon-Fence-Token", "7".parse().unwrap());
    assert_eq!(fence_from_headers(&h).unwrap(), Fence { run_id: "abc-1000".into(), attempt: 2, token: 7 });
}

#[test]
fn names_are_checked() {
    let t = Tables::new("gnomon").unwrap();
    assert_eq!((t.fence.as_str(), t.steps.as_str()), ("gnomon_fence", "gnomon_steps"));
    for bad in ["", "x; drop table y", "1abc", "a-b", &"p".repeat(58)] {
        assert!(matches!(Tables::new(bad), Err(FenceError::BadTable(_))), "{bad:?}");
    }
    assert!(Tables::new(&"p".repeat(57)).is_ok());
    assert!(check_step("run").is_ok());
    assert!(check_step(&"é".repeat(255)).is_ok(), "characters, not bytes");
    assert!(matches!(check_step(""), Err(FenceError::BadStep(_))));
    assert!(matches!(check_step(&"s".repeat(256)), Err(FenceError::BadStep(_))));
    assert!(check_fence(&Fence { run_id: String::new(), attempt: 1, token: 1 }).is_err());
    assert!(check_fence(&Fence { run_id: "r".into(), attempt: 0, token: 1 }).is_err());
    assert!(check_fence(&f(1, 0)).is_ok());
}

#[test]
fn recorded_results_are_json_and_null_when_unrecorded() {
    let Step::Recorded { attempt, token, result } = recorded((2, 7, Some(r#"{"a":[1,"x",null]}"#.into()))).unwrap() else {
        panic!("recorded")
    };
    assert_eq!((attempt, token, result), (2, 7, serde_json::json!({"a": [1, "x", null]})));
    let Step::Recorded { result, .. } = recorded((1, 1, None)).unwrap() else { panic!("recorded") };
    assert_eq!(result, serde_json::Value::Null);
    assert!(matches!(recorded((1, 1, Some("{".into()))), Err(FenceError::BadResult(_))));
}
