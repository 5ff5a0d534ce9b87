//! Every worker implementation — the Rust runtime and the Python and
//! TypeScript SDKs — against a real server: the same protocol cases
//! (`sdk/cases.rs`), a server failover, a frozen worker, and exactly-once
//! steps under frozen workers on PostgreSQL and MariaDB (`sdk/faults.rs`).
//! The SDKs' conformance programs carry the same standard handlers; the
//! Python venv and the TypeScript build come from `scripts/sdk.sh`.

#[path = "sdk/cases.rs"]
mod cases;
mod common;
#[path = "sdk/faults.rs"]
mod faults;
#[path = "sdk/workers.rs"]
mod workers;

use common::*;
use gnomon_backend::testing::testdb::Server as TestServer;
use workers::Sdk;

/// One server, one worker of `sdk`, every case in turn.
fn conformance(sdk: Sdk) {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _server = faults::server(dir.path(), "server", &format!("sqlite://{}/db.sqlite", dir.path().display()), &addr);
    wait_until("the server to lead", cases::WITHIN, || faults::leads(&addr));
    let id = format!("{}-1", sdk.label());
    let _worker = sdk.spawn(dir.path(), &id, std::slice::from_ref(&addr), &[]);
    faults::wait_worker(&addr, &id);
    let ctx = cases::Ctx { sdk, addr, token: None };
    for (name, case) in cases::CASES {
        eprintln!("{sdk:?}: {name}");
        case(&ctx);
    }
}

#[test]
fn the_rust_worker_passes_the_conformance_cases() {
    conformance(Sdk::Rust);
}

#[test]
fn the_python_worker_passes_the_conformance_cases() {
    conformance(Sdk::Python);
}

#[test]
fn the_typescript_worker_passes_the_conformance_cases() {
    conformance(Sdk::TypeScript);
}

#[test]
fn a_frozen_rust_worker_starts_nothing_stale() {
    faults::frozen_worker(Sdk::Rust);
}

#[test]
fn a_frozen_python_worker_starts_nothing_stale() {
    faults::frozen_worker(Sdk::Python);
}

#[test]
fn a_frozen_typescript_worker_starts_nothing_stale() {
    faults::frozen_worker(Sdk::TypeScript);
}

#[test]
fn a_rust_worker_follows_a_failover() {
    faults::failover(Sdk::Rust);
}

#[test]
fn a_python_worker_follows_a_failover() {
    faults::failover(Sdk::Python);
}

#[test]
fn a_typescript_worker_follows_a_failover() {
    faults::failover(Sdk::TypeScript);
}

#[test]
fn exactly_once_steps_hold_for_a_frozen_rust_worker_on_postgres() {
    faults::exactly_once_steps(Sdk::Rust, TestServer::Postgres, false);
}

#[test]
fn exactly_once_steps_hold_for_a_frozen_rust_worker_on_mariadb() {
    // No unguarded control here: a Rust worker drops a stopped attempt's
    // future (its transaction rolls back), so without the step whether the
    // frozen attempt pays too depends on which wakes first, its timer or
    // its cancel.
    faults::exactly_once_steps(Sdk::Rust, TestServer::MySql, false);
}

#[test]
fn exactly_once_steps_hold_for_a_frozen_python_worker_on_postgres() {
    faults::exactly_once_steps(Sdk::Python, TestServer::Postgres, true);
}

#[test]
fn exactly_once_steps_hold_for_a_frozen_python_worker_on_mariadb() {
    faults::exactly_once_steps(Sdk::Python, TestServer::MySql, false);
}

#[test]
fn exactly_once_steps_hold_for_a_frozen_typescript_worker_on_postgres() {
    faults::exactly_once_steps(Sdk::TypeScript, TestServer::Postgres, false);
}

#[test]
fn exactly_once_steps_hold_for_a_frozen_typescript_worker_on_mariadb() {
    faults::exactly_once_steps(Sdk::TypeScript, TestServer::MySql, false);
}

#[test]
fn a_rust_worker_needs_its_credential() {
    faults::credentials(Sdk::Rust);
}

#[test]
fn a_python_worker_needs_its_credential() {
    faults::credentials(Sdk::Python);
}

#[test]
fn a_typescript_worker_needs_its_credential() {
    faults::credentials(Sdk::TypeScript);
}

#[test]
fn a_rust_worker_speaks_tls() {
    faults::tls(Sdk::Rust);
}

#[test]
fn a_python_worker_speaks_tls() {
    faults::tls(Sdk::Python);
}

#[test]
fn a_typescript_worker_speaks_tls() {
    faults::tls(Sdk::TypeScript);
}
