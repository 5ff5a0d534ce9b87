#!/usr/bin/env bash
# Fire benchmark (prints figures, asserts nothing).
#   bench/fires.sh                 # both scenarios: 1,000 jobs every 1s for 60s; 100,000 jobs every 60s for 130s
#   bench/fires.sh JOBS EVERY_SECS DURATION_SECS
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p gnomon --bin gnomon --example bench_fires
if [ $# -ge 3 ]; then
  target/release/examples/bench_fires target/release/gnomon "$1" "$2" "$3"
else
  target/release/examples/bench_fires target/release/gnomon 1000 1 60
  target/release/examples/bench_fires target/release/gnomon 100000 60 130
fi
