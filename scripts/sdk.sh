#!/usr/bin/env bash
# The worker SDKs: prepares what their tests need, runs their own tests and
# builds their publishable artefacts (not published).
#
#   scripts/sdk.sh prepare   # the Python venv (target/py-venv, with the SDK
#                            # installed editable) and the TypeScript build
#                            # (sdk/typescript/dist): what the Rust process
#                            # tests (crates/gnomon/tests/sdk_workers.rs) start
#   scripts/sdk.sh test      # prepare, then each SDK's unit tests
#   scripts/sdk.sh package   # prepare, then `python -m build` and `npm pack`
#                            # into target/sdk-dist
#
# Installs python3 (with venv) and Node.js/npm when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

TARGET=${CARGO_TARGET_DIR:-$PWD/target}
VENV=$TARGET/py-venv

prepare() {
  need_apt python3 python3
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "== installing python3-venv"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
  need_apt node nodejs
  need_apt npm npm
  # The venv is made once and refreshed when the pins change.
  local stamp
  stamp="$VENV/.pins-$(cat sdk/python/requirements-dev.txt sdk/python/pyproject.toml | sha256sum | cut -c1-16)"
  if [ ! -e "$stamp" ]; then
    echo "== preparing the Python SDK's venv in $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r sdk/python/requirements-dev.txt
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -e sdk/python
    touch "$stamp"
  fi
  echo "== building the TypeScript SDK"
  (cd sdk/typescript && npm ci --silent --no-audit --no-fund && npm run --silent build)
}

case "${1:-prepare}" in
  prepare)
    prepare
    ;;
  test)
    prepare
    echo "== Python SDK tests"
    (cd sdk/python && "$VENV/bin/python" -m pytest -q)
    echo "== TypeScript SDK tests"
    (cd sdk/typescript && npm test --silent)
    ;;
  package)
    prepare
    out=$TARGET/sdk-dist
    rm -rf "$out" && mkdir -p "$out"
    echo "== python -m build"
    "$VENV/bin/python" -m build --outdir "$out" sdk/python >/dev/null
    echo "== npm pack"
    (cd sdk/typescript && npm pack --silent --pack-destination "$out" >/dev/null)
    ls -1 "$out"
    ;;
  *)
    echo "usage: scripts/sdk.sh [prepare|test|package]" >&2
    exit 2
    ;;
esac
