#!/usr/bin/env bash
# The test etcd cluster (3 members on loopback): `scripts/etcd.sh start`,
# `scripts/etcd.sh stop`, `scripts/etcd.sh status`. Stops only the members
# this script started, by the PIDs it recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
case "${1:-start}" in
  start) ensure_etcd; echo "etcd: 127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793" ;;
  stop)
    for n in 1 2 3; do
      f="$GNOMON_ETCD_DIR/member-$n/pid"
      [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
      rm -f "$f"
    done ;;
  status) ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793 endpoint status -w table ;;
  *) echo "usage: scripts/etcd.sh start|stop|status" >&2; exit 2 ;;
esac
