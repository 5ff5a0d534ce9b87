#!/usr/bin/env bash
# Runs gnomon in one process (server + worker + embedded SQLite) on 127.0.0.1:7400.
# Extra arguments go to `gnomon dev` (e.g. --data-dir DIR, --listen ADDR).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_toolchain
cargo build --release -p gnomon --bin gnomon
# As root, shell jobs would run as root: gnomon refuses that unless told.
root_flags=()
case " $* " in *" --run-as "*|*" --run-as="*|*" --allow-root-jobs "*) ;; *) mapfile -t root_flags < <(root_jobs_flags) ;; esac
exec target/release/gnomon dev "${root_flags[@]}" "$@"
