//! `gnomon auth`: make credentials for the auth file.

use std::io::Read;

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand};
use gnomon_server::auth::{check_token_strength, new_token, token_hash, Derived, Role};

#[derive(Subcommand, Debug)]
pub enum AuthCmd {
    /// Make a credential: prints a fresh token (shown once) and the entry to
    /// add to the auth file.
    New(NewArgs),
    /// Print the SHA-256 of a token read from standard input (for an auth
    /// file entry of an existing token).
    Hash,
    /// Print the credential that servers sharing the admin token read from
    /// standard input accept from a worker (`worker`) or a raft member
    /// (`member`): give it to external workers, so they never hold the
    /// admin token.
    Derive(DeriveArgs),
}

#[derive(Args, Debug)]
pub struct DeriveArgs {
    /// worker or member.
    #[arg(value_parser = ["worker", "member"])]
    kind: String,
}

fn read_stdin_token() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    let token = s.trim();
    if token.is_empty() {
        bail!("no token on standard input");
    }
    check_token_strength("the token", token).map_err(|e| anyhow!(e))?;
    Ok(token.to_string())
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// The credential's name (shown in audit lines and errors).
    name: String,
    /// viewer, operator, admin, worker or member.
    #[arg(long)]
    role: String,
    /// Limit it to these namespaces (repeat or comma-separate).
    #[arg(long = "namespace", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// For a worker credential: the prefix its worker ids must start with.
    #[arg(long)]
    worker_prefix: Option<String>,
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

pub fn run(cmd: AuthCmd) -> anyhow::Result<()> {
    match cmd {
        AuthCmd::New(a) => {
            let role =
                Role::parse(&a.role).ok_or_else(|| anyhow!("--role {:?} must be viewer, operator, admin, worker or member", a.role))?;
            let token = new_token();
            let mut entry = format!(
                "[[credential]]\nname = {}\nrole = \"{role}\"\ntoken_sha256 = \"{}\"\n",
                toml_string(&a.name),
                hex::encode(token_hash(&token))
            );
            if !a.namespaces.is_empty() {
                let list: Vec<String> = a.namespaces.iter().map(|n| toml_string(n)).collect();
                entry.push_str(&format!("namespaces = [{}]\n", list.join(", ")));
            }
            if let Some(p) = &a.worker_prefix {
                entry.push_str(&format!("worker_prefix = {}\n", toml_string(p)));
            }
            // The entry is checked as the server will read it.
            gnomon_server::auth::file::parse(&entry).map_err(|e| anyhow!(e))?;
            eprintln!("token (shown once; give it to the client as GNOMON_TOKEN):");
            println!("{token}");
            eprintln!("\nadd to the auth file:");
            println!("\n{entry}");
            Ok(())
        }
        AuthCmd::Hash => {
            println!("{}", hex::encode(token_hash(&read_stdin_token()?)));
            Ok(())
        }
        AuthCmd::Derive(a) => {
            let kind = if a.kind == "member" { Derived::Member } else { Derived::Worker };
            println!("{}", kind.token(&read_stdin_token()?));
            Ok(())
        }
    }
}
