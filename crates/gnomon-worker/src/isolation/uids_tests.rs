use std::os::unix::fs::PermissionsExt;

use super::*;

fn range(text: &str) -> UidRange {
    UidRange::parse(text).unwrap()
}

fn data_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

#[test]
fn a_range_is_two_uids_above_root_in_order() {
    assert_eq!(range("200000-200999"), UidRange { first: 200000, last: 200999 });
    assert_eq!(range("7-7").len(), 1);
    for bad in ["", "5", "-", "a-b", "1-2-3", " 1-2", "1-2 ", "+1-2", "-1-5", "99999999999-1", "1-99999999999"] {
        let e = UidRange::parse(bad).unwrap_err();
        assert!(e.contains("FIRST-LAST"), "{bad:?}: {e}");
    }
    assert!(UidRange::parse("0-10").unwrap_err().contains("uid 0, which is root"));
    assert!(UidRange::parse("0-0").unwrap_err().contains("root"));
    assert!(UidRange::parse("10-5").unwrap_err().contains("FIRST (10) is above LAST (5)"));
    assert!(UidRange::parse("10-4294967295").unwrap_err().contains("not a uid"));
    assert_eq!(range("1-4294967294").len(), 4294967294);
}

#[test]
fn a_range_holding_a_users_or_groups_id_is_refused() {
    let passwd = "root:x:0:0:root:/root:/bin/bash\n# a comment:x:5000:5000\nbob:x:1000:2500::/home/bob:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n";
    let group = "root:x:0:\nstaff:x:3000:bob\n";
    assert!(range("200000-200999").check_unused(passwd, group).is_ok());
    assert!(range("4000-4999").check_unused(passwd, group).is_ok(), "a comment line is no user");
    let e = range("900-1100").check_unused(passwd, group).unwrap_err();
    assert!(e.contains("1000 is the id of the user \"bob\" in /etc/passwd"), "{e}");
    let e = range("2000-2999").check_unused(passwd, group).unwrap_err();
    assert!(e.contains("2500") && e.contains("primary group of user \"bob\""), "{e}");
    let e = range("3000-3000").check_unused(passwd, group).unwrap_err();
    assert!(e.contains("group \"staff\" in /etc/group"), "{e}");
    let e = range("60000-70000").check_unused(passwd, group).unwrap_err();
    assert!(e.contains("\"nobody\""), "{e}");
    // This host: its root (uid 0) and nobody are in use.
    assert!(range("65534-65534").check_host().is_err());
}

#[test]
fn each_namespace_gets_its_own_uid_kept_across_restarts() {
    let d = data_dir();
    let r = range("300000-300009");
    let a = UidAllocator::open(d.path(), r).unwrap();
    let (x, y) = (a.uid_for("team-a").unwrap(), a.uid_for("team-b").unwrap());
    assert_eq!((x, y), (300000, 300001), "the lowest free uids, in order of first use");
    assert_eq!(a.uid_for("team-a").unwrap(), x, "a namespace keeps its uid");
    drop(a);
    // Written to disk, readable, private, and with no temporary file left.
    let text = std::fs::read_to_string(d.path().join(FILE)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["namespaces"], serde_json::json!({"team-a": 300000, "team-b": 300001}), "{text}");
    assert_eq!(std::fs::metadata(d.path().join(FILE)).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!d.path().join(TEMP).exists());
    // A restart (with a wider range) keeps every namespace's uid and gives
    // a new one the next free uid.
    let a = UidAllocator::open(d.path(), range("300000-300099")).unwrap();
    assert_eq!((a.uid_for("team-b").unwrap(), a.uid_for("team-a").unwrap()), (y, x));
    assert_eq!(a.uid_for("team-c").unwrap(), 300002);
    assert_eq!(a.allocations().len(), 3);
}

#[test]
fn a_used_up_range_refuses_new_namespaces_and_changes_nothing() {
    let d = data_dir();
    let a = UidAllocator::open(d.path(), range("400000-400001")).unwrap();
    a.uid_for("one").unwrap();
    a.uid_for("two").unwrap();
    let before = std::fs::read(d.path().join(FILE)).unwrap();
    let e = a.uid_for("three").unwrap_err();
    assert!(e.contains("no uid left for namespace \"three\"") && e.contains("all 2 uids of --run-as-range 400000-400001"), "{e}");
    assert_eq!(std::fs::read(d.path().join(FILE)).unwrap(), before);
    assert_eq!(a.allocations().len(), 2);
    assert_eq!((a.uid_for("one").unwrap(), a.uid_for("two").unwrap()), (400000, 400001), "the others keep running");
}

#[test]
fn a_failed_write_gives_no_uid_and_records_nothing() {
    let d = data_dir();
    let a = UidAllocator::open(d.path(), range("500000-500009")).unwrap();
    a.uid_for("kept").unwrap();
    // A directory where the temporary file goes: the write fails.
    std::fs::create_dir(d.path().join(TEMP)).unwrap();
    let e = a.uid_for("new").unwrap_err();
    assert!(e.contains("cannot record the uid of namespace \"new\""), "{e}");
    assert_eq!(a.allocations().keys().collect::<Vec<_>>(), ["kept"]);
    std::fs::remove_dir(d.path().join(TEMP)).unwrap();
    assert_eq!(a.uid_for("new").unwrap(), 500001, "the uid it did not get is still free");
}

#[test]
fn a_second_allocator_on_the_same_dir_is_refused() {
    let d = data_dir();
    let a = UidAllocator::open(d.path(), range("600000-600009")).unwrap();
    let e = UidAllocator::open(d.path(), range("600000-600009")).unwrap_err();
    assert!(e.contains("in use by another gnomon process"), "{e}");
    // Another process too (flock(1) on the same lock file): it cannot take
    // the lock while this one holds it, and this one is refused while it
    // holds it.
    let lock = d.path().join(LOCK);
    let try_lock = || std::process::Command::new("flock").arg("-n").arg(&lock).arg("true").status().unwrap();
    assert!(!try_lock().success(), "another process cannot take the lock while it is held");
    drop(a);
    assert!(try_lock().success(), "the lock goes with its holder");
    // flock holds the lock itself (-o), its command (cat) ends with its input.
    let mut held = std::process::Command::new("flock").arg("-o").arg(&lock).arg("cat").stdin(std::process::Stdio::piped()).spawn().unwrap();
    let mut refused = None;
    for _ in 0..200 {
        match UidAllocator::open(d.path(), range("600000-600009")) {
            Err(e) => {
                refused = Some(e);
                break;
            }
            Ok(a) => drop(a),
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    drop(held.stdin.take());
    let _ = held.wait();
    let e = refused.expect("refused while another process holds the lock");
    assert!(e.contains("in use by another gnomon process"), "{e}");
    assert!(UidAllocator::open(d.path(), range("600000-600009")).is_ok(), "free again once that process ends");
}

#[test]
fn a_file_that_is_not_an_allocation_in_the_range_is_refused() {
    let r = range("700000-700009");
    let cases = [
        ("not json", "not a uid allocation"),
        (r#"{"version":1,"range":"1-2","namespaces":{"a":5}}"#, "outside --run-as-range 700000-700009"),
        (r#"{"version":1,"range":"x","namespaces":{"a":700001,"b":700001}}"#, "uid 700001 is given to two namespaces"),
        (r#"{"version":2,"range":"x","namespaces":{}}"#, "version 2"),
        (r#"{"version":1,"range":"x","namespaces":{},"extra":1}"#, "unknown field"),
    ];
    for (text, want) in cases {
        let d = data_dir();
        std::fs::write(d.path().join(FILE), text).unwrap();
        let e = UidAllocator::open(d.path(), r).unwrap_err();
        assert!(e.contains(want), "{text}: {e}");
        assert_eq!(std::fs::read_to_string(d.path().join(FILE)).unwrap(), text, "a refused file is left as it was");
    }
}

#[test]
fn a_link_at_the_allocation_or_an_open_data_dir_is_refused() {
    let d = data_dir();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("theirs.json");
    std::fs::write(&target, r#"{"version":1,"range":"x","namespaces":{}}"#).unwrap();
    std::os::unix::fs::symlink(&target, d.path().join(FILE)).unwrap();
    let e = UidAllocator::open(d.path(), range("800000-800009")).unwrap_err();
    assert!(e.contains("symbolic link"), "{e}");
    // The lock file and the temporary file are never followed either.
    let d = data_dir();
    std::os::unix::fs::symlink(&target, d.path().join(LOCK)).unwrap();
    assert!(UidAllocator::open(d.path(), range("800000-800009")).is_err());
    let d = data_dir();
    std::os::unix::fs::symlink(&target, d.path().join(TEMP)).unwrap();
    let a = UidAllocator::open(d.path(), range("800000-800009")).unwrap();
    assert_eq!(a.uid_for("ns").unwrap(), 800000);
    assert!(std::fs::symlink_metadata(d.path().join(FILE)).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), r#"{"version":1,"range":"x","namespaces":{}}"#, "the link's target is untouched");
    // A data dir others may write to could have its file swapped.
    let d = data_dir();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = UidAllocator::open(d.path(), range("800000-800009")).unwrap_err();
    assert!(e.contains("writable by no one else"), "{e}");
}
