use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::*;

/// The tests that hand things to another user need root; they fail, never
/// skip, without it.
fn must_be_root(test: &str) {
    assert_eq!(euid(), 0, "{test} needs root (to give files to another user); run the tests as root");
}

const NOBODY: Owner = (65534, 65534);

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A directory and a file a link will point to, with what they held.
fn victims(base: &Path) -> (PathBuf, PathBuf) {
    let dir = base.join("victim-dir");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = base.join("victim-file");
    std::fs::write(&file, "precious").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, file)
}

fn untouched(dir: &Path, file: &Path) {
    let (d, f) = (std::fs::metadata(dir).unwrap(), std::fs::metadata(file).unwrap());
    assert_eq!((d.mode() & 0o7777, d.uid()), (0o755, euid()), "the link's target directory is untouched");
    assert_eq!((f.mode() & 0o7777, f.uid()), (0o644, euid()), "the link's target file is untouched");
    assert_eq!(std::fs::read_to_string(file).unwrap(), "precious");
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "nothing was made in the link's target");
}

#[test]
fn a_link_at_the_work_root_is_refused_and_its_target_untouched() {
    let base = tempfile::tempdir().unwrap();
    let (dir, file) = victims(base.path());
    for (name, target) in [("to-dir", &dir), ("to-file", &file)] {
        let link = base.path().join(name);
        std::os::unix::fs::symlink(target, &link).unwrap();
        for shared in [false, true] {
            let e = WorkRoot::open(&link, shared).unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{name}: {e}");
        }
    }
    // A dangling link: nothing is created where it points.
    let link = base.path().join("dangling");
    std::os::unix::fs::symlink(base.path().join("made-through-link"), &link).unwrap();
    assert!(WorkRoot::open(&link, true).is_err());
    assert!(!base.path().join("made-through-link").exists());
    untouched(&dir, &file);
}

#[test]
fn a_work_root_too_open_or_in_an_open_parent_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("work");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = WorkRoot::open(&root, false).unwrap_err().to_string();
    assert!(e.contains("more open than"), "{e}");
    assert_eq!(mode_of(&root), 0o755, "a refused root keeps its mode");
    // 0711 (what a previous version left) is taken, and set to what is needed.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711)).unwrap();
    let r = WorkRoot::open(&root, false).unwrap();
    assert_eq!(mode_of(r.path()), 0o700);
    drop(r);
    assert!(root.exists(), "a configured root stays");
    // A parent anyone may write to (not sticky) is refused.
    let open = base.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = WorkRoot::open(&open.join("work"), false).unwrap_err().to_string();
    assert!(e.contains("others could replace"), "{e}");
    assert!(!open.join("work").exists());
}

#[test]
fn a_work_root_another_user_owns_is_refused() {
    must_be_root("a_work_root_another_user_owns_is_refused");
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("work");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&root, Some(NOBODY.0), Some(NOBODY.1)).unwrap();
    let e = WorkRoot::open(&root, true).unwrap_err().to_string();
    assert!(e.contains("owned by uid 65534"), "{e}");
    let m = std::fs::metadata(&root).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (NOBODY.0, 0o700), "a refused root is left as it was");
}

#[test]
fn a_shared_root_is_passable_and_its_parent_made_so() {
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let r = WorkRoot::open(&data.join("work"), true).unwrap();
    assert_eq!((mode_of(r.path()), mode_of(&data)), (0o711, 0o711));
}

#[test]
fn a_link_planted_at_an_attempt_directory_or_file_is_refused() {
    let base = tempfile::tempdir().unwrap();
    let (dir, file) = victims(base.path());
    let root = WorkRoot::open(&base.path().join("work"), true).unwrap();
    std::os::unix::fs::symlink(&dir, root.path().join("r1-a1-planted")).unwrap();
    let e = root.make_dir("r1-a1-planted").unwrap_err().to_string();
    assert!(e.contains("already exists"), "{e}");
    let d = root.make_dir("r1-a1-mine").unwrap();
    assert_eq!(mode_of(d.path()), 0o700);
    for name in ["gnomon-params.json", "gnomon-payload"] {
        std::os::unix::fs::symlink(&file, d.path().join(name)).unwrap();
        let e = d.write_file(name, b"{\"secret\":1}", None).unwrap_err().to_string();
        assert!(e.contains("already exists"), "{name}: {e}");
    }
    // A link to a directory where a file goes, and a dangling one.
    std::os::unix::fs::symlink(&dir, d.path().join("to-dir")).unwrap();
    assert!(d.write_file("to-dir", b"x", None).is_err());
    std::os::unix::fs::symlink(dir.join("new"), d.path().join("dangling")).unwrap();
    assert!(d.write_file("dangling", b"x", None).is_err());
    for bad in ["", ".", "..", "../escape", "a/b"] {
        assert!(root.make_dir(bad).is_err(), "{bad:?}");
    }
    assert!(!base.path().join("escape").exists());
    untouched(&dir, &file);
    // Removing an attempt's directory removes its links, not their targets.
    d.remove();
    assert!(!root.path().join("r1-a1-mine").exists());
    untouched(&dir, &file);
}

#[test]
fn what_an_attempt_gets_is_its_users_and_private() {
    must_be_root("what_an_attempt_gets_is_its_users_and_private");
    let base = tempfile::tempdir().unwrap();
    let root = WorkRoot::open(&base.path().join("work"), true).unwrap();
    let d = root.make_dir("r2-a1-x").unwrap();
    let f = d.write_file("gnomon-params.json", b"{}", Some(NOBODY)).unwrap();
    d.hand_over(Some(NOBODY)).unwrap();
    let (dm, fm) = (std::fs::metadata(d.path()).unwrap(), std::fs::metadata(&f).unwrap());
    assert_eq!((dm.uid(), dm.gid(), dm.mode() & 0o7777), (NOBODY.0, NOBODY.1, 0o700));
    assert_eq!((fm.uid(), fm.gid(), fm.mode() & 0o7777), (NOBODY.0, NOBODY.1, 0o600));
    assert_eq!(std::fs::read(&f).unwrap(), b"{}");
}

#[test]
fn a_fresh_root_has_a_random_name_and_goes_when_empty() {
    let base = tempfile::tempdir().unwrap();
    let (a, b) = (WorkRoot::fresh(base.path(), false).unwrap(), WorkRoot::fresh(base.path(), true).unwrap());
    assert_ne!(a.path(), b.path());
    assert_eq!((mode_of(a.path()), mode_of(b.path())), (0o700, 0o711));
    let kept = b.make_dir("kept").unwrap();
    let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
    drop((a, b));
    assert!(!pa.exists(), "an empty fresh root is removed");
    assert!(pb.exists(), "one holding a kept directory stays");
    kept.remove();
}
