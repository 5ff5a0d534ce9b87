//! The documentation's links resolve: every relative link in README.md,
//! ARCHITECTURE.md, bench/*.md and docs/**/*.md names a file or folder of
//! the repository, and every `#anchor` (in the same file or in
//! `file.md#anchor`) names a heading of its target, by the slug rule GitHub
//! and mdBook share (lower case, spaces to '-', other punctuation than '-'
//! and '_' dropped, a repeated heading's slug suffixed `-1`, `-2`, …).
//! `http(s)://` and `mailto:` links are not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// What a link's path names.
enum Entry {
    Dir,
    /// A file, with its text when it is Markdown (for its anchors).
    File(Option<String>),
}

fn options() -> Options {
    Options::ENABLE_TABLES | Options::ENABLE_FOOTNOTES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_HEADING_ATTRIBUTES
}

/// A heading's anchor: lower case, whitespace to '-', letters, digits, '-'
/// and '_' kept, everything else dropped.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.trim().chars() {
        if c.is_alphanumeric() || c == '-' || c == '_' {
            out.extend(c.to_lowercase());
        } else if c.is_whitespace() {
            out.push('-');
        }
    }
    out
}

/// The anchors of a Markdown text's headings (an explicit `{#id}` wins).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut heading: Option<(Option<String>, String)> = None;
    for event in Parser::new_ext(markdown, options()) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => heading = Some((id.map(|i| i.to_string()), String::new())),
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, text)) = heading.as_mut() {
                    text.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((id, text)) = heading.take() {
                    let base = id.unwrap_or_else(|| slug(&text));
                    let n = seen.entry(base.clone()).or_insert(0);
                    out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
                    *n += 1;
                }
            }
            _ => {}
        }
    }
    out
}

/// Every link and image destination of a Markdown text.
fn links(markdown: &str) -> Vec<String> {
    Parser::new_ext(markdown, options())
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. }) | Event::Start(Tag::Image { dest_url, .. }) => Some(dest_url.to_string()),
            _ => None,
        })
        .collect()
}

/// `%20` and the like in a link's path.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 3 <= bytes.len() {
            if let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `base/rel` with `.` and `..` resolved, inside the repository (None when
/// it leaves it). A leading '/' is the repository's root.
fn resolve(base: &Path, rel: &str) -> Option<PathBuf> {
    let start = if rel.starts_with('/') { PathBuf::new() } else { base.to_path_buf() };
    let mut parts: Vec<String> = start.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    for c in Path::new(rel.trim_start_matches('/')).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            _ => {}
        }
    }
    Some(parts.iter().collect())
}

fn is_external(dest: &str) -> bool {
    let lower = dest.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:")
}

/// The broken links of `docs` (paths relative to the repository's root,
/// with their text), one line each; `lookup` says what a path names.
fn broken_links(docs: &[(PathBuf, String)], lookup: &dyn Fn(&Path) -> Option<Entry>) -> Vec<String> {
    let mut broken = Vec::new();
    for (file, text) in docs {
        let dir = file.parent().unwrap_or(Path::new(""));
        for dest in links(text) {
            if is_external(&dest) {
                continue;
            }
            let (path, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest.as_str(), None),
            };
            let path = percent_decode(path);
            let target_text = if path.is_empty() {
                Some(text.clone())
            } else {
                let Some(target) = resolve(dir, &path) else {
                    broken.push(format!("{}: {dest}: leaves the repository", file.display()));
                    continue;
                };
                match lookup(&target) {
                    None => {
                        broken.push(format!("{}: {dest}: no such file {}", file.display(), target.display()));
                        continue;
                    }
                    Some(Entry::Dir) => None,
                    Some(Entry::File(md)) => md,
                }
            };
            let Some(anchor) = anchor else { continue };
            match target_text {
                None => broken.push(format!("{}: {dest}: #{anchor} points into something that is not Markdown", file.display())),
                Some(t) => {
                    if !anchors(&t).contains(&percent_decode(anchor)) {
                        broken.push(format!("{}: {dest}: no heading with the anchor #{anchor}", file.display()));
                    }
                }
            }
        }
    }
    broken
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository's root")
}

fn markdown_under(root: &Path, dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let rel = dir.join(e.file_name());
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            if recursive {
                markdown_under(root, &rel, true, out);
            }
        } else if rel.extension().is_some_and(|x| x == "md") {
            out.push(rel);
        }
    }
}

/// The documents checked, relative to the root.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    markdown_under(root, Path::new("bench"), false, &mut files);
    markdown_under(root, Path::new("docs"), true, &mut files);
    files
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = repo_root();
    let files = documents(&root);
    assert!(files.iter().any(|f| f.starts_with("docs")), "no Markdown found under docs/");
    let docs: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(root.join(&f)).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
            (f, text)
        })
        .collect();
    let lookup = |p: &Path| -> Option<Entry> {
        let full = root.join(p);
        let meta = std::fs::metadata(&full).ok()?;
        if meta.is_dir() {
            return Some(Entry::Dir);
        }
        let md = p.extension().is_some_and(|x| x == "md");
        Some(Entry::File(if md { std::fs::read_to_string(&full).ok() } else { None }))
    };
    let broken = broken_links(&docs, &lookup);
    assert!(broken.is_empty(), "broken links in the documentation:\n{}", broken.join("\n"));
}

#[test]
fn the_slug_rule_is_githubs() {
    assert_eq!(slug("The REST API"), "the-rest-api");
    assert_eq!(slug("Jobs & schedules"), "jobs--schedules");
    assert_eq!(slug("`gnomon job` (the CLI)"), "gnomon-job-the-cli");
    assert_eq!(slug("Time zones and DST."), "time-zones-and-dst");
    assert_eq!(slug("run_as and --run-as-range"), "run_as-and---run-as-range");
    let a = anchors("# Title\n## Notes\n## Notes\n### `env` — what a job sees\n");
    let want: BTreeSet<String> = ["title", "notes", "notes-1", "env--what-a-job-sees"].into_iter().map(String::from).collect();
    assert_eq!(a, want);
}

#[test]
fn the_checker_finds_a_broken_link_and_a_broken_anchor() {
    let files: BTreeMap<PathBuf, String> = [
        ("README.md", "# gnomon\n\n## Next steps\n\nSee [concepts](docs/src/concepts.md#exactly-once), [the tour](#next-steps),\n[gone](docs/src/gone.md), [bad](docs/src/concepts.md#no-such-heading), [self](#nowhere),\n[web](https://example.com/x#y), [mail](mailto:a@example.com) and ![shot](docs/src/shot.png).\n"),
        ("docs/src/concepts.md", "# Concepts\n\n## Exactly once\n\nBack to the [README](../../README.md#next-steps) and [up](../../../outside.md).\n"),
        ("docs/src/shot.png", ""),
    ]
    .into_iter()
    .map(|(p, t)| (PathBuf::from(p), t.to_string()))
    .collect();
    let lookup = |p: &Path| -> Option<Entry> {
        if let Some(t) = files.get(p) {
            let md = p.extension().is_some_and(|x| x == "md");
            return Some(Entry::File(md.then(|| t.clone())));
        }
        files.keys().any(|k| k.starts_with(p)).then_some(Entry::Dir)
    };
    let docs: Vec<(PathBuf, String)> =
        files.iter().filter(|(p, _)| p.extension().is_some_and(|x| x == "md")).map(|(p, t)| (p.clone(), t.clone())).collect();
    let broken = broken_links(&docs, &lookup);
    assert_eq!(broken.len(), 4, "{broken:#?}");
    assert!(broken.iter().any(|b| b.contains("docs/src/gone.md: no such file")), "{broken:#?}");
    assert!(broken.iter().any(|b| b.contains("concepts.md#no-such-heading: no heading")), "{broken:#?}");
    assert!(broken.iter().any(|b| b.contains("README.md: #nowhere: no heading")), "{broken:#?}");
    assert!(broken.iter().any(|b| b.contains("../../../outside.md: leaves the repository")), "{broken:#?}");
}

#[test]
fn percent_escapes_and_dots_resolve() {
    assert_eq!(percent_decode("a%20b.md"), "a b.md");
    assert_eq!(percent_decode("100%"), "100%");
    assert_eq!(resolve(Path::new("docs/src"), "../console.png"), Some(PathBuf::from("docs/console.png")));
    assert_eq!(resolve(Path::new("docs/src"), "./a/../b.md"), Some(PathBuf::from("docs/src/b.md")));
    assert_eq!(resolve(Path::new("docs/src"), "/bench/README.md"), Some(PathBuf::from("bench/README.md")));
    assert_eq!(resolve(Path::new("bench"), "../../x"), None);
}
