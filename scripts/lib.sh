# Shared helpers for gnomon's scripts: install what is missing, nothing more.

need_apt() {
  # need_apt COMMAND PACKAGE: install PACKAGE with apt-get when COMMAND is absent.
  local cmd=$1 pkg=$2
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "== installing $pkg (for $cmd)"
    if [ -z "${GNOMON_APT_UPDATED:-}" ]; then
      apt-get update -qq
      export GNOMON_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  fi
}

ensure_toolchain() {
  if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
      export PATH="$HOME/.cargo/bin:$PATH"
    else
      echo "cargo is missing: install Rust (https://rustup.rs) and run this again" >&2
      exit 1
    fi
  fi
  # The bundled SQLite is compiled from C.
  need_apt cc build-essential
  need_apt pkg-config pkg-config
  rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true
}
