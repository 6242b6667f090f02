#!/usr/bin/env bash
# Writes deploy/base/prometheusrule.yaml from rules/upgrade-gates.yml (tests/deploy.rs
# fails when the two differ).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Generated from rules/upgrade-gates.yml by scripts/sync-prometheusrule.sh: edit the rules there."
  echo "apiVersion: monitoring.coreos.com/v1"
  echo "kind: PrometheusRule"
  echo "metadata:"
  echo "  name: rollgate-upgrade-gates"
  echo "  namespace: rollgate"
  echo "  labels:"
  echo "    app.kubernetes.io/name: rollgate"
  echo "spec:"
  grep -v '^#' rules/upgrade-gates.yml | sed -e 's/^\(.\)/  \1/'
} > deploy/base/prometheusrule.yaml
