#!/usr/bin/env bash
# The API contract test: schemathesis generates requests from the published
# OpenAPI document (GET /v1/openapi.json) and sends them to a real
# `gnomon dev`, in two passes:
# - requests the document calls valid: none may be refused as malformed
#   (400, 413, 422; 404 and 409 are fine), and every answer (status,
#   content type, headers, body) must be one the document describes;
# - requests it calls invalid: each gets a documented status, never a 5xx.
# The rules between two values of a request that JSON Schema cannot state
# are kept by scripts/contract_hooks.py.
#
# Deterministic: a pinned schemathesis (with every dependency pinned in
# scripts/contract-requirements.txt), a fixed seed, derandomized generation
# and a bounded number of examples (scripts/contract.toml). Bounded: both
# passes share CONTRACT_BUDGET seconds (default 170); past it the run
# stops and fails.
#
# Isolated: the server and schemathesis run in a network namespace of
# their own with only a loopback interface, so the jobs the generated
# requests create (HTTP jobs and notifications to generated URLs, shell
# jobs with generated commands) reach nothing outside this machine. As
# root, shell jobs run as `nobody` (--run-as nobody); without root, the
# namespace is a user namespace whose root is the invoking user, and jobs
# run as that user (--allow-root-jobs: in the namespace it is "root").
# The server has no credentials (no --token, loopback only): every call is
# the anonymous admin's, as in `gnomon dev` on a workstation.
#
# Needs the debug binary (`cargo build -p gnomon`; built here if missing),
# python3 with venv, unshare and ip. Extra arguments go to both
# `schemathesis run` passes.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
SEED=271828
CONTRACT_BUDGET=${CONTRACT_BUDGET:-170}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
BIN=$TARGET/debug/gnomon
VENV=$TARGET/contract-venv

if [ "${GNOMON_CONTRACT_INSIDE:-}" != 1 ]; then
  . scripts/lib.sh
  need_apt python3 python3
  need_apt unshare util-linux
  need_apt ip iproute2
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "== installing python3-venv"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  if [ ! -x "$BIN" ]; then
    echo "== building gnomon (debug)"
    cargo build -q -p gnomon --bin gnomon
  fi
  # The venv is made once; its pinned packages are (re)installed when the
  # pins change.
  stamp="$VENV/.pins-$(sha256sum scripts/contract-requirements.txt | cut -c1-16)"
  if [ ! -e "$stamp" ]; then
    echo "== installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r scripts/contract-requirements.txt
    touch "$stamp"
  fi
  "$VENV/bin/schemathesis" --version | grep -qx "schemathesis, version $SCHEMATHESIS_VERSION" ||
    { echo "schemathesis in $VENV is not $SCHEMATHESIS_VERSION" >&2; exit 1; }
  export GNOMON_CONTRACT_INSIDE=1 TARGET BIN VENV
  if [ "$(id -u)" = 0 ]; then
    exec unshare --net -- "$0" "$@"
  else
    exec unshare --user --map-root-user --net -- "$0" "$@"
  fi
fi

# In the namespace: only loopback, brought up here.
ip link set lo up
start=$(date +%s)
data=$(mktemp -d "${TMPDIR:-/tmp}/gnomon-contract.XXXXXX")
log=$TARGET/contract-server.log
port=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
addr=127.0.0.1:$port

# Which user shell jobs run as, said explicitly: see the top of this file.
if awk '$1 == 0 && $2 == 0 { found = 1 } END { exit !found }' /proc/self/uid_map; then
  job_user=(--run-as nobody)
  chmod 0755 "$data"
else
  job_user=(--allow-root-jobs)
fi

# No --token and a loopback listener: the dev server has no credentials,
# and every call is made as the anonymous admin (no Authorization header).
"$BIN" dev --listen "$addr" --data-dir "$data/data" --capacity 4 "${job_user[@]}" >"$log" 2>&1 &
server=$!
stop() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$data"
}
trap stop EXIT

ready=0
for _ in $(seq 1 300); do
  if "$VENV/bin/python" - "$addr" <<'PY' 2>/dev/null; then ready=1; break; fi
import json, sys, urllib.request
with urllib.request.urlopen(f"http://{sys.argv[1]}/readyz", timeout=1) as r:
    sys.exit(0 if json.load(r).get("leading") else 1)
PY
  kill -0 "$server" 2>/dev/null || break
  sleep 0.2
done
if [ "$ready" != 1 ]; then
  echo "gnomon dev did not become ready; its log ($log):" >&2
  tail -n 40 "$log" >&2
  exit 1
fi

deadline=$((start + CONTRACT_BUDGET))
status=0
run_pass() {
  # run_pass LABEL ARGS...: one schemathesis run against the server, within
  # what is left of the budget.
  local label=$1 left rc
  shift
  left=$((deadline - $(date +%s)))
  if [ "$left" -le 0 ]; then
    echo "contract: no time left for $label" >&2
    status=1
    return
  fi
  echo "== schemathesis $SCHEMATHESIS_VERSION, seed $SEED, $label, against gnomon dev on $addr"
  set +e
  PYTHONPATH=scripts timeout --kill-after=10 "$left" "$VENV/bin/schemathesis" --no-color --config-file scripts/contract.toml run \
    "http://$addr/v1/openapi.json" --url "http://$addr" \
    --seed "$SEED" --generation-deterministic --workers 1 "$@"
  rc=$?
  set -e
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "contract: schemathesis did not finish within ${CONTRACT_BUDGET}s" >&2
  fi
  [ "$rc" = 0 ] || status=1
}

# Requests the document calls valid: accepted (or 404/409), answered as
# documented (scripts/contract.toml).
run_pass "valid requests" "$@"
# Requests the document calls invalid: a documented 4xx, never a 5xx
# (their answers' bodies are error bodies; no acceptance check applies).
run_pass "invalid requests" --mode negative --phases coverage,fuzzing --max-examples 5 --exclude-checks response_schema_conformance,positive_data_acceptance "$@"

elapsed=$(($(date +%s) - start))
if ! kill -0 "$server" 2>/dev/null; then
  echo "contract: gnomon dev exited during the run; its log ($log):" >&2
  tail -n 40 "$log" >&2
  status=1
fi
echo "contract: $([ "$status" = 0 ] && echo passed || echo FAILED) after ${elapsed}s"
exit "$status"
