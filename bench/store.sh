#!/usr/bin/env bash
# Store benchmark (prints figures, asserts nothing): fires/s, batched
# transitions/s and end-to-end runs/s on SQLite, MariaDB and PostgreSQL.
#   bench/store.sh                  # all three
#   bench/store.sh postgres         # just one (sqlite, mariadb, postgres)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
ensure_mariadb
ensure_postgres
cargo build --release -p gnomon --example bench_store
target/release/examples/bench_store "$@"
