#!/usr/bin/env bash
# Worker benchmark (prints figures, asserts nothing): A (throughput, 20,000
# noop runs, one worker of capacity 50), B1 (2,000 one-shot jobs due at one
# instant) and B2 (2,000 due 1 ms apart), on SQLite with fsync on.
#   bench/workers.sh            # all
#   bench/workers.sh A          # or B1, B2
#   BENCH_ROUNDS=5 bench/workers.sh   # five rounds, then min / median / max
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
cargo build --release -p gnomon --bin gnomon --example bench_workers
target/release/examples/bench_workers target/release/gnomon "$@"
