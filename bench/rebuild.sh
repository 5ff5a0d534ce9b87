#!/usr/bin/env bash
# Leader rebuild benchmark (prints figures, asserts nothing): how long a
# leader takes to load its state from the store, at 10,000 and 100,000 jobs.
#   bench/rebuild.sh [JOBS…]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p gnomon-server --example bench_rebuild
target/release/examples/bench_rebuild "$@"
