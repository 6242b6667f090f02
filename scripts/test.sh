#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs and starts the services the
# tests use, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/services.sh
. scripts/services.sh

DEBIAN_FRONTEND=noninteractive apt-get update -q
ensure_build_tools
ensure_rabbitmq
# Prometheus (with promtool), Alertmanager (with amtool) and the Pushgateway: the tests
# start their own on loopback.
apt_install prometheus prometheus-alertmanager prometheus-pushgateway
# etcd 3.4 for the etcd adapter tests (the tests start their own members on loopback).
apt_install etcd-server etcd-client
# The Kubernetes upgrade tests: an sshd per fake node (started by the tests on loopback),
# curl for the stub kubelet, shellcheck for scripts/node-upgrade.sh.
apt_install openssh-server openssh-client curl shellcheck
# The node script's tests run Debian's own apt and dpkg, dnf and rpm, and zypper, each in
# a root of their own, over repositories they build with dpkg-deb and apt-ftparchive
# (apt-utils), rpmbuild and createrepo_c. dnf's versionlock comes from dnf-plugins-core,
# which cannot be installed beside zypper: its package is unpacked where the tests' dnf
# finds its plugins (tests/support/nodes.rs, DNF_PLUGINS).
apt_install apt-utils dnf rpm createrepo-c zypper
if [ ! -f /opt/rollgate-tests/dnf-plugins-core/usr/lib/python3/dist-packages/dnf-plugins/versionlock.py ]; then
    fetched=$(mktemp -d)
    chmod 0777 "$fetched"
    (cd "$fetched" && apt-get download -q dnf-plugins-core)
    mkdir -p /opt/rollgate-tests
    dpkg-deb -x "$fetched"/dnf-plugins-core_*.deb /opt/rollgate-tests/dnf-plugins-core
    rm -rf "$fetched"
fi
# sudo's visudo and sudo -l read deploy/node/sudoers (in a private mount namespace:
# util-linux's unshare; the machine's own sudoers is never touched).
apt_install sudo util-linux
# PostgreSQL's server binaries for the PostgreSQL store and the replica tests (the tests
# initdb and start their own server on loopback, and stop it by PID).
apt_install postgresql
# Headless Chromium and its WebDriver for the status page's browser test; procps's pkill
# ends what is left of a test's browser.
apt_install chromium chromium-driver procps
# libfaketime, to step rollgate's wall clock (forward and back) in the fault tests.
apt_install faketime
# kubectl for the kustomize build of deploy/ (Debian's kubernetes-client when none is here).
command -v kubectl >/dev/null || apt_install kubernetes-client
# mdBook (from crates.io, once per machine) builds the handbook; tests/docs.rs checks its
# pages, links and anchors, and that the generated reference pages are current.
command -v mdbook >/dev/null || cargo install --locked mdbook --version 0.5.4 --no-default-features
mdbook build docs --dest-dir "${CARGO_TARGET_DIR:-$PWD/target}/book"
# Arguments (a filter, --test NAME, …) run one cargo test as given.
if [ "$#" -gt 0 ]; then
    exec cargo test --locked "$@"
fi

# Everything builds once. Most tests wait on scaled time, not on a core, so the test
# binaries then run in two groups side by side, each with loopback ports of its own
# (ROLLGATE_TEST_PORTS, tests/support/mod.rs), each group's binaries one at a time as
# cargo runs them. The groups balance the slow binaries; a new test file joins the second.
# tests/amqp_outage.rs stops the RabbitMQ every AMQP test uses: it runs alone, after them.
cargo test --locked --no-run
first=(rehearsal faults sandbox control_planes analysis fleet status_page fuzz_intake)
alone=(amqp_outage)
second=()
for file in tests/*.rs; do
    name=$(basename "$file" .rs)
    case " ${first[*]} ${alone[*]} " in
    *" $name "*) ;;
    *) second+=("$name") ;;
    esac
done
logs=$(mktemp -d)
run_group() {
    local name=$1 ports=$2
    shift 2
    local start=$SECONDS
    if ROLLGATE_TEST_PORTS=$ports cargo test --locked "$@" >"$logs/$name" 2>&1; then
        echo "test group $name: passed in $((SECONDS - start)) s" >>"$logs/$name"
    else
        echo "test group $name: FAILED after $((SECONDS - start)) s" >>"$logs/$name"
        return 1
    fi
}
targets() { for name in "$@"; do printf -- '--test %s ' "$name"; done; }
status=0
# shellcheck disable=SC2046 # test names are plain words
run_group first 20000-25999 $(targets "${first[@]}") &
first_pid=$!
# shellcheck disable=SC2046
run_group second 26000-31999 --lib --bins $(targets "${second[@]}") &
second_pid=$!
wait "$first_pid" || status=1
wait "$second_pid" || status=1
# The failing group's output last, where a reader of the tail looks.
for passed in true false; do
    for name in first second; do
        if grep -q "^test group $name: passed" "$logs/$name"; then
            [ "$passed" = true ] && cat "$logs/$name"
        else
            [ "$passed" = false ] && cat "$logs/$name"
        fi
    done
done
rm -rf "$logs"
[ "$status" -eq 0 ] || exit "$status"
# shellcheck disable=SC2046
cargo test --locked $(targets "${alone[@]}")
cargo test --locked --doc
