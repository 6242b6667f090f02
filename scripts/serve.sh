#!/usr/bin/env bash
# rollgate doing its job on this machine: starts a LOCAL SANDBOX cluster (cargo run
# --example sandbox: a fake API server, 1 control plane and 6 workers behind real sshd with
# stub tools, real etcd, Prometheus with the shipped rules, Alertmanager, a Pushgateway;
# time at 1/120) and `rollgate serve` against it, then prints the status page's address
# and a token. Ctrl-C stops both, and everything the sandbox started.
#
#   scripts/serve.sh          the sandbox and rollgate (files under ./sandbox)
#   scripts/serve.sh --bare   rollgate alone on embedded defaults: 127.0.0.1:8080, data
#                             under ./data, an API token generated into ./data/api-token;
#                             no broker, no cluster
#
# Environment: ROLLGATE_SANDBOX_DIR (default ./sandbox), ROLLGATE_SANDBOX_PORT (rollgate's
# port, default 8080), ROLLGATE_BIN_DIR (a directory holding rollgate and
# examples/sandbox already built: no cargo build).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/services.sh
. scripts/services.sh

build_tools() {
    if ! command -v cc >/dev/null || ! command -v protoc >/dev/null || [ ! -f /usr/include/google/protobuf/descriptor.proto ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q
    fi
    ensure_build_tools
}

if [ "${1:-}" = --bare ]; then
    shift
    build_tools
    exec cargo run --locked --release -- serve "$@"
fi

echo "==> rollgate on a LOCAL SANDBOX: a stand-in cluster on this machine, not a real one <=="
dir=${ROLLGATE_SANDBOX_DIR:-$PWD/sandbox}
port=${ROLLGATE_SANDBOX_PORT:-8080}
ensure_sandbox_tools
if [ -n "${ROLLGATE_BIN_DIR:-}" ]; then
    bin=$ROLLGATE_BIN_DIR
else
    build_tools
    cargo build --locked --bin rollgate --example sandbox
    bin=${CARGO_TARGET_DIR:-$PWD/target}/debug
fi

# A directory the sandbox made before is started afresh; any other is left alone.
if [ -e "$dir" ] && [ ! -e "$dir/.rollgate-sandbox" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "$dir holds files the sandbox did not make: set ROLLGATE_SANDBOX_DIR elsewhere" >&2
    exit 2
fi
rm -rf "$dir"
mkdir -p "$dir"
touch "$dir/.rollgate-sandbox"

sandbox_pid=""
rollgate_pid=""
# shellcheck disable=SC2317 # run by the EXIT trap
stop() {
    trap - INT TERM EXIT
    local pid
    for pid in "$rollgate_pid" "$sandbox_pid"; do
        [ -n "$pid" ] || continue
        kill -TERM "$pid" 2>/dev/null || continue
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    done
    echo "stopped: rollgate and the sandbox"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$bin/examples/sandbox" --dir "$dir" --port "$port" --needing-reboot w1,w2 \
    > "$dir/sandbox.log" 2>&1 &
sandbox_pid=$!
until grep -q '^sandbox ready' "$dir/sandbox.log"; do
    if ! kill -0 "$sandbox_pid" 2>/dev/null; then
        cat "$dir/sandbox.log" >&2
        echo "the sandbox did not start (its log is above)" >&2
        exit 1
    fi
    sleep 0.2
done
grep '^sandbox:' "$dir/sandbox.log"

"$bin/rollgate" --config "$dir/rollgate.toml" serve >> "$dir/rollgate.log" 2>&1 &
rollgate_pid=$!
until curl -sf "http://127.0.0.1:$port/healthz" >/dev/null; do
    if ! kill -0 "$rollgate_pid" 2>/dev/null; then
        cat "$dir/rollgate.log" >&2
        echo "rollgate did not start (its log is above)" >&2
        exit 1
    fi
    sleep 0.2
done

cat <<BANNER

  LOCAL SANDBOX is up: 1 control plane + 6 workers at v1.34.2, time at 1/120.
  Status page:  http://127.0.0.1:$port/ui
  Token:        $(cat "$dir/admin-token")
  In another terminal:  . $dir/env   then follow the README's five-minute tour.
  rollgate's log: $dir/rollgate.log    Ctrl-C stops everything.

BANNER

# Until either ends (or Ctrl-C): then the trap stops the other.
wait -n "$rollgate_pid" "$sandbox_pid" || true
echo "rollgate or the sandbox stopped" >&2
exit 1
