#!/usr/bin/env bash
# A three-member gnomon cluster on this machine with the embedded Raft store
# (no database, no etcd): members on 127.0.0.1:7401, :7402 and :7403, data
# under ./.gnomon-raft/, each with an embedded worker.
#   scripts/raft-demo.sh          start (member 1 bootstraps the cluster the first time)
#   scripts/raft-demo.sh stop     stop the members this script started
#   scripts/raft-demo.sh clean    stop them and delete their data
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
DATA=.gnomon-raft
PEERS="1=127.0.0.1:7401,2=127.0.0.1:7402,3=127.0.0.1:7403"

stop() {
    for i in 1 2 3; do
        if [ -f "$DATA/m$i.pid" ]; then
            pid=$(cat "$DATA/m$i.pid")
            kill "$pid" 2>/dev/null || true
            rm -f "$DATA/m$i.pid"
        fi
    done
}

case "${1:-start}" in
stop) stop; exit 0 ;;
clean) stop; sleep 1; rm -rf "$DATA"; exit 0 ;;
start) ;;
*) echo "usage: scripts/raft-demo.sh [start|stop|clean]" >&2; exit 2 ;;
esac

ensure_toolchain
cargo build --release -p gnomon --bin gnomon
mkdir -p "$DATA"
mapfile -t root_flags < <(root_jobs_flags)
for i in 1 2 3; do
    if [ -f "$DATA/m$i.pid" ] && kill -0 "$(cat "$DATA/m$i.pid")" 2>/dev/null; then
        echo "member $i is already running (pid $(cat "$DATA/m$i.pid"))"
        continue
    fi
    extra=()
    [ "$i" = 1 ] && extra=(--raft-bootstrap)
    target/release/gnomon server --store "raft://$PWD/$DATA/m$i" --raft-id "$i" --raft-peers "$PEERS" \
        --listen "127.0.0.1:740$i" --node-id "member-$i" --capacity 4 "${root_flags[@]}" "${extra[@]}" >"$DATA/m$i.log" 2>&1 &
    echo $! >"$DATA/m$i.pid"
done
for i in 1 2 3; do wait_port "740$i" 30 || { echo "member $i did not start; see $DATA/m$i.log" >&2; exit 1; }; done
cat <<MSG
Three members run on 127.0.0.1:7401, :7402 and :7403 (logs in $DATA/m*.log).
  target/release/gnomon --server http://127.0.0.1:7402 leader
  target/release/gnomon --server http://127.0.0.1:7403 job create tick --cron '*/10 * * * * *' -- date   # any member takes writes
  kill -9 \$(cat $DATA/m1.pid)                                         # another member takes over
Stop them with scripts/raft-demo.sh stop (data kept) or clean (data deleted).
MSG
