#!/usr/bin/env bash
# node-k3s.sh: upgrades one k3s or RKE2 node to a release, from the release artifacts an
# operator's mirror serves laid out as GitHub's releases are (MIRROR/RELEASE/FILE).
# rollgate pipes it over SSH:  bash -s -- ACTION --distribution k3s|rke2 ...
#
#   --check   [--release R --mirror URL]   prove the node answers, has the tools and (not
#                                          as root) the sudo rules; with a release, that
#                                          the mirror has its checksum file
#   --stage   --release R --mirror URL     download the release's artifact and check it
#                                          against the release's sha256sum file, before
#                                          the node is drained
#   --apply   --release R --mirror URL --role server|agent
#                                          put the staged binary in place atomically,
#                                          keeping the previous one beside it as
#                                          NAME.previous, and restart the service
#   --installed                            print the installed release
#
# R is a release as its project names it: v1.31.4+k3s1, v1.31.4+rke2r1.
# Safe to re-run: --stage keeps a verified download; --apply swaps only a binary that is
# not the release, and restarts the service once per release (a marker records it). It
# takes the node's lock and ignores SIGHUP and SIGPIPE, so a dropped SSH session never
# leaves a half-done swap, and a redo waits for the first run to end.
# Environment (for unusual layouts): ROLLGATE_BIN_DIR (default /usr/local/bin),
# ROLLGATE_STATE_DIR (default /var/lib/rollgate), LOCK_WAIT (seconds, default 900).
# Exit status: 0 done; 2 refused or failed; 4 the release is missing from the mirror or
# its artifact does not match its checksum (no retry makes it right).
set -euo pipefail

action="" distribution="" release="" mirror="" role=""
ROLLGATE_BIN_DIR=${ROLLGATE_BIN_DIR:-/usr/local/bin}
ROLLGATE_STATE_DIR=${ROLLGATE_STATE_DIR:-/var/lib/rollgate}
LOCK_WAIT=${LOCK_WAIT:-900}

# Once the session is gone nobody reads the output: a failed write is not a failure.
die() { echo "node-k3s: $*" >&2 || true; exit 2; }
refuse() { echo "node-k3s: $*" >&2 || true; exit 4; }
log() { echo "node-k3s: $*" || true; }

while [ $# -gt 0 ]; do
  case "$1" in
    --check) action=check; shift ;;
    --stage) action=stage; shift ;;
    --apply) action=apply; shift ;;
    --installed) action=installed; shift ;;
    --distribution) distribution=${2:-}; shift 2 || die "--distribution needs a value" ;;
    --release) release=${2:-}; shift 2 || die "--release needs a value" ;;
    --mirror) mirror=${2:-}; shift 2 || die "--mirror needs a value" ;;
    --role) role=${2:-}; shift 2 || die "--role needs a value" ;;
    *) die "unknown argument: $1" ;;
  esac
done

case "$distribution" in
  k3s) binary=k3s; build='k3s' ;;
  rke2) binary=rke2; build='rke2r' ;;
  *) die "--distribution must be k3s or rke2, got '$distribution'" ;;
esac
# The same rule as rollgate's own parser: nothing else reaches a URL or a path.
is_release() { [[ $1 =~ ^v(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\+${build}[1-9][0-9]{0,2}$ ]]; }
is_mirror() { [[ $1 =~ ^https?://[A-Za-z0-9._:/@%-]+$ ]] && [[ $1 != *..* ]]; }
needs_release() {
  is_release "$release" || die "--release must be vMAJOR.MINOR.PATCH+${build}N, got '$release'"
  is_mirror "$mirror" || die "--mirror must be an http(s) URL of letters, digits and ._:/@%-, got '$mirror'"
}

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi

case "$(uname -m)" in
  x86_64|amd64) arch=amd64 ;;
  aarch64|arm64) arch=arm64 ;;
  *) die "runs on $(uname -m): rollgate's k3s and RKE2 driver knows amd64 and arm64" ;;
esac
# The artifact that carries the binary, as each project publishes it.
if [ "$distribution" = k3s ]; then
  if [ "$arch" = amd64 ]; then artifact=k3s; else artifact="k3s-$arch"; fi
else
  artifact="rke2.linux-$arch.tar.gz"
fi
sums="sha256sum-$arch.txt"
installed_binary="$ROLLGATE_BIN_DIR/$binary"

# The release's directory on the mirror: GitHub's download URLs spell + as %2B.
release_url() { echo "${mirror%/}/${release//+/%2B}"; }

# The release the installed binary reports, or nothing.
installed() {
  [ -x "$installed_binary" ] || return 0
  "$installed_binary" --version 2>/dev/null | awk 'NR == 1 { print $3 }'
}

service() {
  case "$distribution/$role" in
    k3s/server) echo k3s ;;
    k3s/agent) echo k3s-agent ;;
    rke2/server) echo rke2-server ;;
    rke2/agent) echo rke2-agent ;;
    *) die "--role must be server or agent, got '$role'" ;;
  esac
}

# Takes this node's lock (fd 9), shared with node-upgrade.sh, for the rest of the script,
# and detaches from the session's signals.
lock_node() {
  trap '' HUP PIPE
  $SUDO install -d -m 0755 -o "$(id -un)" "$ROLLGATE_STATE_DIR"
  exec 9>>"$ROLLGATE_STATE_DIR/node-upgrade.lock"
  if ! flock -n 9; then
    log "another node script runs on this node; waiting up to ${LOCK_WAIT}s for it"
    flock -w "$LOCK_WAIT" 9 || die "another node script still runs on this node after ${LOCK_WAIT}s"
  fi
}

stage_dir() { echo "$ROLLGATE_STATE_DIR/stage/$release"; }

# Downloads the release's checksum file and artifact, unless a verified copy is there,
# and checks the artifact against its line in the checksum file.
stage() {
  local dir url expected actual
  dir=$(stage_dir)
  if [ -f "$dir/verified" ] && [ -f "$dir/$artifact" ]; then
    log "$release already staged and verified"
    return
  fi
  mkdir -p "$dir"
  url=$(release_url)
  curl -fsSL --retry 2 -o "$dir/$sums" "$url/$sums" 9>&- \
    || refuse "the mirror has no $sums for $release: $url/$sums"
  expected=$(awk -v f="$artifact" '$2 == f || $2 == "*" f { print $1 }' "$dir/$sums")
  [ -n "$expected" ] || refuse "$url/$sums has no line for $artifact"
  curl -fsSL --retry 2 -o "$dir/$artifact.part" "$url/$artifact" 9>&- \
    || refuse "the mirror has no $artifact for $release: $url/$artifact"
  actual=$(sha256sum "$dir/$artifact.part" | awk '{ print $1 }')
  if [ "$actual" != "$expected" ]; then
    rm -f "$dir/$artifact.part"
    refuse "checksum mismatch for $url/$artifact: $sums says $expected, the download is $actual"
  fi
  mv -f "$dir/$artifact.part" "$dir/$artifact"
  touch "$dir/verified"
  log "$release staged: $artifact sha256 $actual"
}

# The binary out of the staged artifact (RKE2's tarball carries it as bin/rke2).
staged_binary() {
  local dir
  dir=$(stage_dir)
  if [ "$distribution" = k3s ]; then echo "$dir/$artifact"; return; fi
  if [ ! -f "$dir/bin/rke2" ]; then
    tar -xzf "$dir/$artifact" -C "$dir" bin/rke2 || die "$artifact has no bin/rke2"
  fi
  echo "$dir/bin/rke2"
}

apply() {
  local unit now marker
  unit=$(service)
  marker="$ROLLGATE_STATE_DIR/$binary-restarted-$release"
  now=$(installed)
  if [ "$now" != "$release" ]; then
    stage
    local new
    new=$(staged_binary)
    $SUDO install -m 0755 "$new" "$installed_binary.new"
    if [ -e "$installed_binary" ]; then $SUDO ln -f "$installed_binary" "$installed_binary.previous"; fi
    $SUDO mv -f "$installed_binary.new" "$installed_binary"
    [ "$(installed)" = "$release" ] || die "$installed_binary reports '$(installed)' after the swap, not $release"
    rm -f "$marker"
    log "$binary ${now:-(none)} -> $release; the previous binary is $installed_binary.previous"
  elif [ -f "$marker" ]; then
    log "$binary already at $release and $unit restarted on it"
    return
  fi
  $SUDO systemctl restart "$unit" 9>&-
  touch "$marker"
  log "$unit restarted at $release"
}

sudo_rules() {
  [ -n "$SUDO" ] || return 0
  local rule missing=() unit staged="$binary"
  [ "$distribution" = rke2 ] && staged=bin/rke2
  for rule in "install -m 0755 $ROLLGATE_STATE_DIR/stage/v1.0.0+${build}1/$staged $installed_binary.new" \
      "ln -f $installed_binary $installed_binary.previous" \
      "mv -f $installed_binary.new $installed_binary" \
      "install -d -m 0755 -o $(id -un) $ROLLGATE_STATE_DIR"; do
    # shellcheck disable=SC2086
    sudo -n -l $rule >/dev/null 2>&1 || missing+=("$rule")
  done
  for unit in $([ "$distribution" = k3s ] && echo "k3s k3s-agent" || echo "rke2-server rke2-agent"); do
    sudo -n -l systemctl restart "$unit" >/dev/null 2>&1 || missing+=("systemctl restart $unit")
  done
  [ "${#missing[@]}" -eq 0 ] || die "sudo does not let $(id -un) run these without a password: $(printf '%s; ' "${missing[@]}")add deploy/node/sudoers to /etc/sudoers.d"
}

check() {
  local tool
  for tool in curl sha256sum flock systemctl tar; do
    command -v "$tool" >/dev/null || die "$tool is missing on this node"
  done
  sudo_rules
  [ -x "$installed_binary" ] || die "$installed_binary is missing: this is not a $distribution node"
  if [ -n "$release" ]; then
    needs_release
    local url
    url="$(release_url)/$sums"
    curl -fsS -o /dev/null "$url" 9>&- || refuse "the mirror has no release $release: $url does not answer"
  fi
  log "ok: $distribution $(installed)"
}

case "$action" in
  check) check ;;
  stage) needs_release; lock_node; stage ;;
  apply) needs_release; service > /dev/null; lock_node; apply ;;
  installed) installed ;;
  *) die "say what to do: --check, --stage, --apply or --installed" ;;
esac
