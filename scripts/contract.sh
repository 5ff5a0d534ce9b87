#!/usr/bin/env bash
# The API contract test: schemathesis generates requests from the published
# OpenAPI document (GET /v1/openapi.json) and sends them to a real
# `gnomon dev`. It passes when no answer is a 5xx, every answer (status,
# content type, headers, body) is one the document describes, and no
# request the document calls valid is refused as malformed (400, 413, 422).
#
# Deterministic: a pinned schemathesis (with every dependency pinned), a
# fixed seed, derandomized generation and a bounded number of examples
# (scripts/contract.toml). Bounded: the run is stopped after
# CONTRACT_BUDGET seconds and then fails.
#
# Isolated: the server and schemathesis run in a network namespace of
# their own with only a loopback interface, so the jobs the generated
# requests create (HTTP jobs and notifications to generated URLs, shell
# jobs with generated commands) reach nothing outside this machine. As
# root, shell jobs run as `nobody` (--run-as nobody); without root, the
# namespace is a user namespace whose root is the invoking user, and jobs
# run as that user (--allow-root-jobs: in the namespace it is "root").
#
# Needs the debug binary (`cargo build -p gnomon`), python3 with venv,
# unshare and ip. Extra arguments go to `schemathesis run`.
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
    need_apt __python3_venv_missing python3-venv
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

echo "== schemathesis $SCHEMATHESIS_VERSION, seed $SEED, against gnomon dev on $addr"
set +e
PYTHONPATH=scripts timeout --kill-after=10 "$CONTRACT_BUDGET" "$VENV/bin/schemathesis" --no-color --config-file scripts/contract.toml run \
  "http://$addr/v1/openapi.json" --url "http://$addr" \
  --seed "$SEED" --generation-deterministic --workers 1 "$@"
status=$?
set -e
elapsed=$(($(date +%s) - start))
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "contract: schemathesis did not finish within ${CONTRACT_BUDGET}s" >&2
fi
if ! kill -0 "$server" 2>/dev/null; then
  echo "contract: gnomon dev exited during the run; its log ($log):" >&2
  tail -n 40 "$log" >&2
  status=1
fi
echo "contract: schemathesis exited $status after ${elapsed}s"
exit "$status"
