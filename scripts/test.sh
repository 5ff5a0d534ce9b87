#!/usr/bin/env bash
# The whole test suite: formatting, clippy (-D warnings) and every test.
# Installs what it needs on a fresh Debian/Ubuntu machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
# The SQL store tests run against real servers; install and start them if missing.
ensure_mariadb
ensure_postgres
# The etcd tests use a 3-member etcd cluster on loopback (scripts/etcd.sh);
# those that stop members or compact history start private clusters of
# their own with the same etcd binary.
ensure_etcd
# The browser-safety and console tests drive a headless Chromium.
ensure_chromium
# The clock-skew test runs a server under libfaketime.
ensure_faketime
# The worker SDKs' process tests start the Python and TypeScript
# conformance workers: their venv and build come first.
echo "== worker SDKs (Python venv, TypeScript build)"
scripts/sdk.sh prepare
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "== the engine plans without I/O (its dependency tree)"
# No async runtime, store, RPC or HTTP crate may reach gnomon-engine.
if cargo tree -p gnomon-engine -e normal --prefix none | grep -E '^(tokio|mio|tonic|hyper|axum|reqwest|sqlx|rusqlite|etcd-client|openraft) '; then
  echo "gnomon-engine depends on the crates above: it must plan without I/O" >&2
  exit 1
fi
echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
echo "== cargo test"
cargo test --workspace 2>&1 | tee target/test-output.log
# The API contract: schemathesis against the debug `gnomon dev` the tests
# built (scripts/contract.sh: pinned, derandomized, at most 3 minutes).
echo "== API contract (schemathesis)"
contract=0
scripts/contract.sh 2>&1 | tee target/contract-output.log || contract=1
# The SDKs' own tests, and their packages built (not published).
echo "== worker SDK tests and packages"
sdk=0
{ scripts/sdk.sh test && scripts/sdk.sh package; } 2>&1 | tee target/sdk-output.log || sdk=1
# One closing line for the whole run (the contract and the SDKs count as
# one test each).
passed=$(grep -Eo 'test result: ok\. [0-9]+ passed' target/test-output.log | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' target/test-output.log | awk '{s+=$1} END {print s+0}')
passed=$((passed + 2 - contract - sdk))
failed=$((failed + contract + sdk))
echo "gnomon: $passed passed, $failed failed"
[ "$contract" = 0 ] && [ "$sdk" = 0 ]
