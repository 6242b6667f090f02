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
cargo test --locked "$@"
