//! Configuration: a TOML file (`--config FILE` or `GNOMON_CONFIG`), then
//! environment variables, then flags — each overrides the one before.
//!
//! The file's settings are the flags' long names (`retain-for`, or
//! `retain_for`): top-level keys for the global ones (`server`, `token`,
//! `ca`, `log-format`) and a table per command (`[server]`, `[dev]`,
//! `[worker]`). Before the command line is parsed, each setting of the
//! running command that is not already in the environment is put there as
//! its flag's variable, so every value goes through the flag's own parser
//! and checks, and a variable or a flag still wins.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use clap::CommandFactory;

use crate::Cli;

/// The commands whose settings a file may hold, besides the global ones.
pub const SECTIONS: [&str; 3] = ["server", "dev", "worker"];

/// What a configuration file set.
#[derive(Debug, Default)]
pub struct Loaded {
    pub path: Option<PathBuf>,
    /// The variables the file supplied (not already in the environment).
    pub from_file: BTreeMap<String, String>,
}

/// The file named by `--config` on the command line, else `GNOMON_CONFIG`.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--" {
            break;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    std::env::var_os("GNOMON_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The command whose table of the file applies: the first of `server`,
/// `dev`, `worker` among the arguments (so `config show server` reads
/// `[server]`).
fn section(args: &[OsString]) -> Option<&'static str> {
    args.iter().skip(1).find_map(|a| match a.to_str() {
        // The doctor checks what a server would use.
        Some("doctor") => Some("server"),
        Some(a) => SECTIONS.iter().find(|s| **s == a).copied(),
        None => None,
    })
}

/// A TOML value as the text a flag would take.
fn flag_text(key: &str, value: &toml::Value, delimited: bool) -> anyhow::Result<String> {
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Array(items) if delimited => {
            items.iter().map(|v| flag_text(key, v, false)).collect::<anyhow::Result<Vec<_>>>()?.join(",")
        }
        toml::Value::Array(_) => bail!("{key}: takes one value, not a list"),
        other => bail!("{key}: {} is not a value this setting takes", other.type_str()),
    })
}

/// The variable of `key` among `cmd`'s flags.
fn variable_of(cmd: &clap::Command, where_: &str, key: &str) -> anyhow::Result<(String, bool)> {
    let long = key.replace('_', "-");
    let arg = cmd.get_arguments().find(|a| a.get_long() == Some(long.as_str())).ok_or_else(|| {
        let mut known: Vec<String> =
            cmd.get_arguments().filter(|a| a.get_env().is_some()).filter_map(|a| a.get_long().map(str::to_string)).collect();
        known.sort();
        anyhow!("{where_}: unknown setting {key:?} (known: {})", known.join(", "))
    })?;
    let env = arg.get_env().and_then(|e| e.to_str()).ok_or_else(|| anyhow!("{where_}: {key:?} cannot be set in a file"))?;
    Ok((env.to_string(), arg.get_value_delimiter().is_some()))
}

/// Reads the configuration file, if any, and puts its settings for this
/// invocation into the environment. Call before any thread starts.
pub fn load(args: &[OsString]) -> anyhow::Result<Loaded> {
    let Some(path) = config_path(args) else { return Ok(Loaded::default()) };
    let text = std::fs::read_to_string(&path).with_context(|| format!("--config {}", path.display()))?;
    let table: toml::Table = text.parse().map_err(|e| anyhow!("--config {}: not TOML: {e}", path.display()))?;
    let root = Cli::command();
    let running = section(args);
    let mut settings: Vec<(String, String)> = Vec::new();
    for (key, value) in &table {
        if let toml::Value::Table(inner) = value {
            let cmd = SECTIONS
                .contains(&key.as_str())
                .then(|| root.find_subcommand(key))
                .flatten()
                .ok_or_else(|| anyhow!("--config {}: unknown table [{key}] (tables: [server], [dev], [worker])", path.display()))?;
            for (k, v) in inner {
                let where_ = format!("--config {}: [{key}]", path.display());
                let (env, delimited) = variable_of(cmd, &where_, k)?;
                let text = flag_text(k, v, delimited).map_err(|e| anyhow!("{where_}: {e}"))?;
                if running == Some(key.as_str()) {
                    settings.push((env, text));
                }
            }
        } else {
            let where_ = format!("--config {}", path.display());
            let (env, delimited) = variable_of(&root, &where_, key)?;
            settings.push((env, flag_text(key, value, delimited).map_err(|e| anyhow!("{where_}: {e}"))?));
        }
    }
    let mut loaded = Loaded { path: Some(path), from_file: BTreeMap::new() };
    for (env, value) in settings {
        if std::env::var_os(&env).is_none() {
            // Single-threaded here: the runtime starts after this.
            std::env::set_var(&env, &value);
            loaded.from_file.insert(env, value);
        }
    }
    Ok(loaded)
}

/// Hides what a setting's value must not show: tokens and passwords, and
/// the password inside a store or etcd URL.
pub fn redact(name: &str, value: &str) -> String {
    if name.contains("token") || name.contains("password") {
        return if value.is_empty() { String::new() } else { "(set, hidden)".into() };
    }
    match value.split_once("://") {
        Some((scheme, rest)) => {
            let (auth, host) = match rest.split_once('@') {
                Some(parts) => parts,
                None => return value.to_string(),
            };
            match auth.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                None => value.to_string(),
            }
        }
        None => value.to_string(),
    }
}

/// One line of `config show`.
#[derive(Debug, serde::Serialize)]
pub struct Setting {
    pub name: String,
    pub variable: Option<String>,
    pub value: String,
    /// `flag`, `env`, `file` or `default`.
    pub source: &'static str,
}

/// The effective settings of `command` with `extra` flags, as the command
/// would see them.
pub fn effective(command: &str, extra: &[String], loaded: &Loaded) -> anyhow::Result<Vec<Setting>> {
    if !SECTIONS.contains(&command) {
        bail!("config show takes one of: {}", SECTIONS.join(", "));
    }
    let mut argv = vec!["gnomon".to_string(), command.to_string()];
    argv.extend(extra.iter().cloned());
    let matches = Cli::command().try_get_matches_from(&argv).map_err(|e| anyhow!("{}", e.render().to_string().trim()))?;
    let sub = matches.subcommand_matches(command).ok_or_else(|| anyhow!("no {command} settings"))?;
    let root = Cli::command();
    let cmd = root.find_subcommand(command).ok_or_else(|| anyhow!("no command {command}"))?;
    let globals = root.get_arguments().filter(|a| a.is_global_set());
    let mut out = Vec::new();
    for arg in globals.chain(cmd.get_arguments()) {
        let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else { continue };
        if ["help", "version", "config", "output"].contains(&long) || out.iter().any(|s: &Setting| s.name == long) {
            continue;
        }
        let variable = arg.get_env().and_then(|e| e.to_str()).map(str::to_string);
        let source = match sub.value_source(id) {
            Some(clap::parser::ValueSource::CommandLine) => "flag",
            Some(clap::parser::ValueSource::EnvVariable) => {
                if variable.as_ref().is_some_and(|v| loaded.from_file.contains_key(v)) {
                    "file"
                } else {
                    "env"
                }
            }
            Some(clap::parser::ValueSource::DefaultValue) => "default",
            _ => "unset",
        };
        let value =
            sub.get_raw(id).map(|vals| vals.map(|v| v.to_string_lossy().to_string()).collect::<Vec<_>>().join(",")).unwrap_or_default();
        out.push(Setting { name: long.to_string(), variable, value: redact(long, &value), source });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_hidden() {
        assert_eq!(redact("token", "abc"), "(set, hidden)");
        assert_eq!(redact("store", "postgres://gnomon:secret@db:5432/g"), "postgres://gnomon:***@db:5432/g");
        assert_eq!(redact("store", "sqlite:///var/lib/g.db"), "sqlite:///var/lib/g.db");
        assert_eq!(redact("etcd", "https://root:pw@e1:2379"), "https://root:***@e1:2379");
    }

    #[test]
    fn values_become_flag_text() {
        assert_eq!(flag_text("k", &toml::Value::Integer(5), false).unwrap(), "5");
        assert_eq!(flag_text("k", &toml::Value::Boolean(true), false).unwrap(), "true");
        let list = toml::Value::Array(vec!["a".into(), "b".into()]);
        assert_eq!(flag_text("k", &list, true).unwrap(), "a,b");
        assert!(flag_text("k", &list, false).is_err());
    }
}
