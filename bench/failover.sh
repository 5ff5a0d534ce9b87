#!/usr/bin/env bash
# Failover benchmark (prints figures, asserts nothing): three replicas and a
# worker, a job firing every second; the leader is killed with SIGKILL and
# then SIGTERM, 10 times each, for etcd election (PostgreSQL store), the
# MySQL GET_LOCK elector, the PostgreSQL advisory-lock elector, the etcd
# store (etcd-store) and the embedded Raft store (raft: three members, no
# database). Prints p50 and max of signal -> new term fenced and
# signal -> first fire by the new leader.
#   bench/failover.sh                       # all backends, 10 kills, TTL 5s
#   bench/failover.sh --kills 20 mysql      # one backend, more kills
#   bench/failover.sh --ttl 3s etcd etcd-store
#   bench/failover.sh --kills 5 raft
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
ensure_mariadb
ensure_postgres
ensure_etcd
cargo build --release -p gnomon --bin gnomon --example bench_failover
target/release/examples/bench_failover target/release/gnomon "$@"
