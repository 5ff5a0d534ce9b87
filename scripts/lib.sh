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
  # gnomon-proto compiles the worker protocol with protoc.
  need_apt protoc protobuf-compiler
  rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true
}

port_open() {
  # port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_port() {
  # wait_port PORT SECONDS
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    port_open "$1" && return 0
    sleep 0.1
  done
  return 1
}

ensure_mariadb() {
  # MariaDB on 127.0.0.1:3306 with root (empty password) and database `test`,
  # as the tests expect (override with GNOMON_TEST_MYSQL_URL).
  [ -n "${GNOMON_TEST_MYSQL_URL:-}" ] && return 0
  need_apt mysql mariadb-client
  if ! port_open 3306; then
    need_apt mysqld mariadb-server
    echo "== starting MariaDB"
    service mariadb start >/dev/null 2>&1 || service mysql start >/dev/null 2>&1 || {
      mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
      (mysqld_safe --bind-address=127.0.0.1 >/dev/null 2>&1 &)
    }
    wait_port 3306 60 || { echo "MariaDB did not start on 127.0.0.1:3306" >&2; exit 1; }
  fi
  if ! mysql -h 127.0.0.1 -P 3306 -uroot -e "SELECT 1" test >/dev/null 2>&1; then
    echo "== configuring MariaDB: root over TCP with an empty password, database test"
    mysql -uroot <<'SQL' || { echo "cannot configure MariaDB as root (socket); set GNOMON_TEST_MYSQL_URL" >&2; exit 1; }
CREATE DATABASE IF NOT EXISTS test;
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
  fi
}

ensure_postgres() {
  # PostgreSQL on 127.0.0.1:5432, trust auth for a superuser `root`,
  # database `test` (override with GNOMON_TEST_POSTGRES_URL).
  [ -n "${GNOMON_TEST_POSTGRES_URL:-}" ] && return 0
  need_apt psql postgresql-client
  if ! port_open 5432; then
    need_apt pg_ctlcluster postgresql
    echo "== starting PostgreSQL"
    service postgresql start >/dev/null 2>&1 || pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start
    wait_port 5432 60 || { echo "PostgreSQL did not start on 127.0.0.1:5432" >&2; exit 1; }
  fi
  if ! psql -h 127.0.0.1 -U root -d test -c "SELECT 1" >/dev/null 2>&1; then
    echo "== configuring PostgreSQL: trust for 127.0.0.1, superuser root, database test"
    local hba
    hba=$(su postgres -c "psql -tAc 'SHOW hba_file'")
    if ! grep -q "gnomon-test" "$hba"; then
      sed -i '1i host all all 127.0.0.1/32 trust # gnomon-test' "$hba"
      su postgres -c "psql -qc 'SELECT pg_reload_conf()'" >/dev/null
    fi
    su postgres -c "psql -qc \"DO \\\$\\\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'root') THEN CREATE ROLE root SUPERUSER LOGIN; END IF; END\\\$\\\$\"" >/dev/null
    su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname = 'test'\"" | grep -q 1 || su postgres -c "createdb -O root test"
    psql -h 127.0.0.1 -U root -d test -c "SELECT 1" >/dev/null || { echo "PostgreSQL is not usable as root@127.0.0.1/test" >&2; exit 1; }
  fi
}

# A 3-member etcd cluster on loopback for the election and etcd tests:
# clients on 127.0.0.1:23791-23793, peers on 127.0.0.1:23801-23803. Data
# and logs under ${GNOMON_ETCD_DIR:-/tmp/gnomon-etcd}; member PIDs in
# member-N/pid (stop them with scripts/etcd.sh stop). Override with
# GNOMON_TEST_ETCD (a comma list of endpoints) to use another cluster.
GNOMON_ETCD_DIR=${GNOMON_ETCD_DIR:-/tmp/gnomon-etcd}

etcd_member_start() {
  # etcd_member_start N: starts member N (1..3) unless its port answers.
  local n=$1 dir="$GNOMON_ETCD_DIR/member-$1"
  local client=$((23790 + n)) peer=$((23800 + n))
  port_open "$client" && return 0
  mkdir -p "$dir"
  local cluster="m1=http://127.0.0.1:23801,m2=http://127.0.0.1:23802,m3=http://127.0.0.1:23803"
  local state=new
  [ -d "$dir/data/member" ] && state=existing
  ETCD_UNSUPPORTED_ARCH=${ETCD_UNSUPPORTED_ARCH:-} nohup etcd --name "m$n" --data-dir "$dir/data" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state "$state" --initial-cluster-token gnomon-test \
    --heartbeat-interval 100 --election-timeout 1000 --auto-compaction-retention 1h \
    --quota-backend-bytes 2147483648 >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
}

ensure_etcd() {
  [ -n "${GNOMON_TEST_ETCD:-}" ] && return 0
  need_apt etcd etcd-server
  need_apt etcdctl etcd-client
  local n
  for n in 1 2 3; do etcd_member_start "$n"; done
  for n in 1 2 3; do
    wait_port $((23790 + n)) 60 || { echo "etcd member $n did not start; see $GNOMON_ETCD_DIR/member-$n/log" >&2; exit 1; }
  done
  local i
  for ((i = 0; i < 300; i++)); do
    ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793 endpoint health >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "etcd cluster is not healthy; see $GNOMON_ETCD_DIR/member-*/log" >&2
  exit 1
}

ensure_chromium() {
  # The browser-safety and console tests drive a real headless Chromium
  # (the console test through chromedriver).
  need_apt chromium chromium
  need_apt chromedriver chromium-driver
}

ensure_faketime() {
  # The clock-skew test runs a raft member under libfaketime.
  need_apt faketime faketime
}

root_jobs_flags() {
  # root_jobs_flags: as root, the flag that lets a local demo run its shell
  # jobs as root (gnomon refuses otherwise), with a note saying so; nothing
  # for anyone else. Use: flags=($(root_jobs_flags)).
  if [ "$(id -u)" = 0 ]; then
    echo "note: running as root, so shell jobs run as root too (--allow-root-jobs); start gnomon as an unprivileged user, or pass --run-as USER, to keep jobs away from this machine's root" >&2
    echo --allow-root-jobs
  fi
}
