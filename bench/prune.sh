#!/usr/bin/env bash
# Retention benchmark (prints figures, asserts nothing): 1,000,000 terminal
# runs on SQLite, MariaDB/MySQL and PostgreSQL, pruned in the leader's rounds.
#   bench/prune.sh                 # all three
#   bench/prune.sh sqlite          # or mysql, postgres
#   BENCH_PRUNE_RUNS=100000 bench/prune.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
ensure_mariadb
ensure_postgres
cargo build --release -p gnomon --example bench_prune
target/release/examples/bench_prune "$@"
