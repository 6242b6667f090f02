#!/usr/bin/env bash
# Installs and starts what the test suite talks to. Sourced by scripts/test.sh.
# Debian packages only; idempotent; safe to run as root on a fresh machine.

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing: ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
}

ensure_build_tools() {
    command -v cargo >/dev/null || { echo "cargo is required (rustup)"; exit 1; }
    command -v cc >/dev/null || apt_install gcc libc6-dev
    # etcd-client compiles etcd's protobuf API at build time.
    apt_install protobuf-compiler libprotobuf-dev
}

ensure_rabbitmq() {
    apt_install rabbitmq-server
    if ! timeout 10 rabbitmqctl -q status >/dev/null 2>&1; then
        echo "starting rabbitmq-server"
        rabbitmq-server -detached
    fi
    timeout 120 rabbitmqctl -q await_startup
    echo "rabbitmq-server is up"
}

# What the sandbox (cargo run --example sandbox, scripts/serve.sh) runs: etcd, Prometheus
# (with promtool), Alertmanager (with amtool), the Pushgateway, an sshd per node, curl for
# the stub kubelet, and kubectl to look at the sandbox's cluster. apt-get update runs only
# when something is missing.
ensure_sandbox_tools() {
    local pkgs=(etcd-server etcd-client prometheus prometheus-alertmanager prometheus-pushgateway
        openssh-server openssh-client curl jq)
    command -v kubectl >/dev/null || pkgs+=(kubernetes-client)
    local pkg
    for pkg in "${pkgs[@]}"; do
        if ! dpkg -s "$pkg" >/dev/null 2>&1; then
            DEBIAN_FRONTEND=noninteractive apt-get update -q
            break
        fi
    done
    apt_install "${pkgs[@]}"
}
