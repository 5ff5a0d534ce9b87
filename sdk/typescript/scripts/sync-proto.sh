#!/bin/sh
# Copies the canonical worker protocol into this package (which ships its own
# copy, loaded at runtime). Run it whenever the protocol changes; the test
# suite fails while the two differ.
set -eu
here="$(cd "$(dirname "$0")/.." && pwd)"
src="$here/../../crates/gnomon-proto/proto/gnomon/worker/v1/worker.proto"
dst="$here/proto/gnomon/worker/v1/worker.proto"
if [ ! -f "$src" ]; then
  echo "sync-proto: canonical proto not found at $src" >&2
  exit 1
fi
mkdir -p "$(dirname "$dst")"
cp "$src" "$dst"
echo "sync-proto: copied $src -> $dst"
