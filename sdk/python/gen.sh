#!/usr/bin/env bash
# Regenerates the protobuf and gRPC stubs of the worker protocol from the
# canonical proto file into src/gnomon_worker/_pb/ (or into the directory
# given as the first argument). Needs grpcio-tools (requirements-dev.txt);
# set PYTHON to choose the interpreter.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proto_root="${PROTO_ROOT:-$here/../../crates/gnomon-proto/proto}"
out="${1:-$here/src/gnomon_worker/_pb}"
python="${PYTHON:-python3}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$python" -m grpc_tools.protoc \
  -I "$proto_root" \
  --python_out="$tmp" \
  --pyi_out="$tmp" \
  --grpc_python_out="$tmp" \
  gnomon/worker/v1/worker.proto

mkdir -p "$out"
gen="$tmp/gnomon/worker/v1"
cp "$gen/worker_pb2.py" "$gen/worker_pb2.pyi" "$out/"
# The gRPC module imports its messages by their proto package path; inside
# this package they sit beside it.
sed -e 's/^from gnomon\.worker\.v1 import worker_pb2 as /from . import worker_pb2 as /' \
  "$gen/worker_pb2_grpc.py" >"$out/worker_pb2_grpc.py"
