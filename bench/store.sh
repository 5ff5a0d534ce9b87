#!/usr/bin/env bash
# Store benchmark (prints figures, asserts nothing): fires/s, batched
# transitions/s and end-to-end runs/s on SQLite, MariaDB, PostgreSQL and etcd.
#   bench/store.sh                  # all four
#   bench/store.sh postgres         # just one (sqlite, mariadb, postgres, etcd)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
ensure_mariadb
ensure_postgres
ensure_etcd
cargo build --release -p gnomon --example bench_store
target/release/examples/bench_store "$@"
