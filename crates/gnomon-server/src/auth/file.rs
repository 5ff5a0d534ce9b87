//! The auth file (`--auth-file`, TOML): named credentials kept as hashes.
//!
//! ```toml
//! [[credential]]
//! name = "ci"
//! role = "admin"                 # viewer | operator | admin | worker | member
//! token_sha256 = "9f86d081…"     # printed by `gnomon auth new`
//! namespaces = ["payments"]      # optional: only these namespaces
//!
//! [[credential]]
//! name = "pool-a"
//! role = "worker"
//! token_sha256 = "…"
//! worker_prefix = "pool-a-"      # optional: its worker ids start with this
//! namespaces = ["payments"]      # optional: only these namespaces' runs
//!
//! [[credential]]
//! name = "raft"
//! role = "member"                # raft members speak to each other with it
//! token_sha256 = "…"
//! ```

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::{Principal, Role};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    credential: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    role: Role,
    token_sha256: String,
    namespaces: Option<Vec<String>>,
    worker_prefix: Option<String>,
}

/// Reads and checks an auth file: every entry valid, names and hashes unique.
pub fn read(path: &Path) -> Result<Vec<([u8; 32], Principal)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--auth-file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("--auth-file {}: {e}", path.display()))
}

/// Parses the auth file's text.
pub fn parse(text: &str) -> Result<Vec<([u8; 32], Principal)>, String> {
    let file: AuthFile = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(file.credential.len());
    for (i, e) in file.credential.into_iter().enumerate() {
        let at = format!("credential {} ({:?})", i + 1, e.name);
        gnomon_core::spec::validate_name("name", &e.name, 128).map_err(|err| format!("{at}: {}", err.message))?;
        if !names.insert(e.name.clone()) {
            return Err(format!("{at}: the name is used twice"));
        }
        let bytes = hex::decode(e.token_sha256.trim()).map_err(|_| format!("{at}: token_sha256 must be 64 hex digits"))?;
        let hash: [u8; 32] = bytes.try_into().map_err(|_| format!("{at}: token_sha256 must be 64 hex digits"))?;
        let namespaces = match e.namespaces {
            None => None,
            Some(list) if list.is_empty() => return Err(format!("{at}: namespaces is empty (leave it out to allow all)")),
            Some(list) => {
                for ns in &list {
                    gnomon_core::spec::validate_name("namespace", ns, gnomon_core::spec::MAX_NAME_LEN)
                        .map_err(|err| format!("{at}: namespace {ns:?}: {}", err.message))?;
                }
                if e.role == Role::Member {
                    return Err(format!("{at}: a member credential speaks for the whole cluster; it has no namespaces"));
                }
                Some(Arc::from(list))
            }
        };
        let worker_prefix = match e.worker_prefix {
            None => None,
            Some(_) if e.role != Role::Worker => return Err(format!("{at}: worker_prefix applies to the worker role only")),
            Some(p) if p.is_empty() => return Err(format!("{at}: worker_prefix is empty (leave it out to allow any id)")),
            Some(p) => Some(Arc::from(p.as_str())),
        };
        out.push((hash, Principal { name: Arc::from(e.name.as_str()), role: e.role, namespaces, worker_prefix }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_good_file_parses() {
        let text = format!(
            "[[credential]]\nname = \"ci\"\nrole = \"operator\"\ntoken_sha256 = \"{H}\"\nnamespaces = [\"a\", \"b\"]\n\n\
             [[credential]]\nname = \"pool\"\nrole = \"worker\"\ntoken_sha256 = \"{}\"\nworker_prefix = \"pool-\"\nnamespaces = [\"a\"]\n\n\
             [[credential]]\nname = \"raft\"\nrole = \"member\"\ntoken_sha256 = \"{}\"\n",
            H.replace('9', "8"),
            H.replace('9', "7")
        );
        let v = parse(&text).unwrap();
        assert_eq!(v.len(), 3);
        assert!(v[1].1.sees("a") && !v[1].1.sees("b"), "a worker credential may be limited to namespaces");
        assert_eq!(v[2].1.role, Role::Member);
        assert_eq!(v[0].1.role, Role::Operator);
        assert!(v[0].1.sees("a") && !v[0].1.sees("c"));
        assert_eq!(v[1].1.worker_prefix.as_deref(), Some("pool-"));
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn bad_files_say_why() {
        let entry = |extra: &str| format!("[[credential]]\nname = \"x\"\nrole = \"viewer\"\ntoken_sha256 = \"{H}\"\n{extra}");
        for (text, why) in [
            (entry("color = 1"), "unknown field"),
            (entry("namespaces = []"), "namespaces is empty"),
            (entry("worker_prefix = \"w-\""), "worker role only"),
            (entry("namespaces = [\"a b\"]"), "namespace"),
            (entry("namespaces = [\"a\"]").replace("viewer", "member"), "no namespaces"),
            (format!("{}\n{}", entry(""), entry("")), "used twice"),
            ("[[credential]]\nname = \"x\"\nrole = \"root\"\ntoken_sha256 = \"00\"\n".into(), "role"),
            ("[[credential]]\nname = \"x\"\nrole = \"viewer\"\ntoken_sha256 = \"zz\"\n".into(), "64 hex"),
            ("[[credential]]\nname = \"x\"\nrole = \"viewer\"\n".into(), "token_sha256"),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
