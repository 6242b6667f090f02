#!/usr/bin/env bash
# Builds rollgate and runs `rollgate serve` on embedded defaults: 127.0.0.1:8080, data
# under ./data, an API token generated into ./data/api-token. No broker, no cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/services.sh
. scripts/services.sh
if ! command -v cc >/dev/null || ! command -v protoc >/dev/null || [ ! -f /usr/include/google/protobuf/descriptor.proto ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
fi
ensure_build_tools
exec cargo run --locked --release -- serve "$@"
