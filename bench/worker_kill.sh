#!/usr/bin/env bash
# Worker-death detection on the etcd store (prints figures, asserts nothing):
# 20 workers, each killed with SIGKILL while it runs an attempt; prints the
# delay from the kill to the attempt's end as lost, p50/p99/max.
#   bench/worker_kill.sh                   # 20 kills, session TTL 15s
#   bench/worker_kill.sh --ttl 5s --kills 10
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
ensure_etcd
cargo build --release -p gnomon --bin gnomon --example bench_worker_kill
target/release/examples/bench_worker_kill target/release/gnomon "$@"
