#!/usr/bin/env bash
# node-upgrade.sh: upgrades kubeadm, kubelet and kubectl on one kubeadm node, with its own
# package manager: apt (Debian, Ubuntu), dnf (RHEL, Rocky, Alma, Fedora) or zypper (SUSE,
# openSUSE), read off /etc/os-release. rollgate pipes it over SSH:  bash -s -- ACTION
#
#   --role control-plane|worker --release X.Y.Z [--kubeadm apply|node]
#                                                 upgrade this node: kubeadm upgrade apply on
#                                                 the first control plane (the default for
#                                                 control-plane), kubeadm upgrade node on the
#                                                 other control planes and on workers
#   --stage --release X.Y.Z                       download kubeadm, kubelet and kubectl X.Y.Z
#                                                 into the package manager's cache, each
#                                                 checked against the repository's
#                                                 checksums, before the node is drained;
#                                                 installs nothing, holds stay
#   --containerd X.Y.Z                            upgrade containerd to X.Y.Z
#   --apt-minor 1.NN                              point the Kubernetes package repository
#                                                 (apt's source, dnf's or zypper's .repo)
#                                                 at v1.NN
#   --plan --release X.Y.Z                        kubeadm upgrade plan; report the package for X.Y.Z
#   --check [--release X.Y.Z]                     prove the node answers, runs an OS the
#                                                 script serves, has the tools, and (not
#                                                 as root) that sudo lets it run what it
#                                                 needs without a password
#                                                 (deploy/node/sudoers); with a release,
#                                                 that its repository offers it
#   --available                                   list the kubeadm packages the repository
#                                                 offers, as `apt-cache madison` lines
#                                                 (read-only)
#   --manager apt|dnf|zypper                      with any of the above: the package manager
#                                                 to use, in place of the one /etc/os-release
#                                                 suggests (the node's
#                                                 rollgate.io/package-manager label)
#
# dnf, as the kubeadm docs set it up: the repository excludes the Kubernetes packages
# (`exclude=kubelet kubeadm kubectl …`), so they are installed with
# --disableexcludes=kubernetes and stay excluded; a package held by `dnf versionlock` is
# unlocked for its install and locked again at the new version. zypper: a package locked
# with `zypper addlock` is unlocked for its install and locked again. apt: packages are
# held with apt-mark, unheld for their install and held again.
#
# Safe to re-run: each part checks what is installed before it changes anything, and
# `kubeadm upgrade` runs once per release (a marker in ROLLGATE_STATE_DIR records it).
# Runs that change the node take a lock there, so a re-run after a dropped SSH session
# waits for the first one, which goes on to its end: SIGHUP and SIGPIPE are ignored, so
# losing the session never kills kubeadm half-way.
# Environment (for unusual layouts): K8S_APT_SOURCE (default
# /etc/apt/sources.list.d/kubernetes.list), K8S_RPM_REPO (default
# /etc/yum.repos.d/kubernetes.repo), K8S_ZYPP_REPO (default
# /etc/zypp/repos.d/kubernetes.repo), CONTAINERD_PACKAGE (default containerd.io),
# ROLLGATE_STATE_DIR (default /var/lib/rollgate), LOCK_WAIT (seconds, default 900),
# OS_RELEASE (default /etc/os-release).
# Exit status: 0 done; 2 refused or failed; 3 this node's OS is not one the script serves;
# 4 the node's repository does not offer the release (--check, --stage), or a package
# does not match the repository's checksum (--stage).
set -euo pipefail

role="" release="" containerd="" apt_minor="" action="" kubeadm="" manager_named=""
K8S_APT_SOURCE=${K8S_APT_SOURCE:-/etc/apt/sources.list.d/kubernetes.list}
K8S_RPM_REPO=${K8S_RPM_REPO:-/etc/yum.repos.d/kubernetes.repo}
K8S_ZYPP_REPO=${K8S_ZYPP_REPO:-/etc/zypp/repos.d/kubernetes.repo}
CONTAINERD_PACKAGE=${CONTAINERD_PACKAGE:-containerd.io}
ROLLGATE_STATE_DIR=${ROLLGATE_STATE_DIR:-/var/lib/rollgate}
LOCK_WAIT=${LOCK_WAIT:-900}
OS_RELEASE=${OS_RELEASE:-/etc/os-release}

# Once the session is gone nobody reads the output: a failed write is not a failure.
die() { echo "node-upgrade: $*" >&2 || true; exit 2; }
refuse() { echo "node-upgrade: $*" >&2 || true; exit 4; }
log() { echo "node-upgrade: $*" || true; }

while [ $# -gt 0 ]; do
  case "$1" in
    --role) role=${2:-}; shift 2 || die "--role needs a value" ;;
    --release) release=${2:-}; shift 2 || die "--release needs a value" ;;
    --kubeadm) kubeadm=${2:-}; shift 2 || die "--kubeadm needs a value" ;;
    --containerd) containerd=${2:-}; action=containerd; shift 2 || die "--containerd needs a value" ;;
    --apt-minor) apt_minor=${2:-}; action=apt-minor; shift 2 || die "--apt-minor needs a value" ;;
    --plan) action=plan; shift ;;
    --stage) action=stage; shift ;;
    --check) action=check; shift ;;
    --available) action=available; shift ;;
    --manager) manager_named=${2:-}; shift 2 || die "--manager needs a value" ;;
    *) die "unknown argument: $1" ;;
  esac
done

is_version() { [[ $1 =~ ^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$ ]]; }
is_minor() { [[ $1 =~ ^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$ ]]; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive

# The package version string (e.g. 1.34.5-1.1, 1.34.5-150500.1.1) the repository has for
# release $2 of $1. awk reads to the end: leaving early would kill the lister with
# SIGPIPE, which pipefail turns into this script's exit status (141).
candidate() {
  case "$manager" in
    apt) apt-cache madison "$1" | awk -v want="$2" '!found && index($3, want "-") == 1 { print $3; found = 1 }' ;;
    dnf) dnf -q list --showduplicates --disableexcludes=kubernetes "$1" 2>/dev/null \
           | awk -v pkg="$1." -v want="$2" '!found && index($1, pkg) == 1 && index($2, want "-") == 1 { print $2; found = 1 }' ;;
    zypper) zypper_versions "$1" | awk -v want="$2" '!found && index($1, want "-") == 1 { print $1; found = 1 }' ;;
  esac
}

# Every version of $1 zypper's repositories list, one per line with the repository.
zypper_versions() {
  zypper -q --non-interactive search -s --match-exact "$1" 2>/dev/null \
    | awk -F'|' -v pkg="$1" '{ for (i = 1; i <= NF; i++) gsub(/^ +| +$/, "", $i) } $2 == pkg { print $4, $6 }'
}

# The installed version string of $1, empty when it is not installed.
installed() {
  case "$manager" in
    apt) dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true ;;
    dnf|zypper) if rpm -q --quiet "$1"; then rpm -q --qf '%{VERSION}-%{RELEASE}' "$1"; fi ;;
  esac
}

# Where the package lists come from, and the command that shows them (for messages).
repository() {
  case "$manager" in
    apt) echo "apt repository (apt-cache madison $1)" ;;
    dnf) echo "dnf repository (dnf list --showduplicates --disableexcludes=kubernetes $1)" ;;
    zypper) echo "zypper repository (zypper search -s --match-exact $1)" ;;
  esac
}

# Reads the repositories' package lists again.
refresh() {
  case "$manager" in
    apt) $SUDO apt-get update -q ;;
    dnf) $SUDO dnf -q -y makecache >/dev/null ;;
    zypper) $SUDO zypper --non-interactive refresh >/dev/null ;;
  esac
}

# Takes this node's upgrade lock (fd 9) for the rest of the script, waiting for a run
# still going (one whose SSH session dropped), and detaches from the session's signals.
# Commands that may leave a process behind run with fd 9 closed (9>&-), so that nothing
# outlives the script holding its lock.
lock_node() {
  trap '' HUP PIPE
  $SUDO install -d -m 0755 -o "$(id -un)" "$ROLLGATE_STATE_DIR"
  exec 9>>"$ROLLGATE_STATE_DIR/node-upgrade.lock"
  if ! flock -n 9; then
    log "another node-upgrade.sh runs on this node; waiting up to ${LOCK_WAIT}s for it"
    flock -w "$LOCK_WAIT" 9 || die "another node-upgrade.sh still runs on this node after ${LOCK_WAIT}s"
  fi
}

# Whether dnf's versionlock, or zypper's locks, hold $1.
locked() {
  case "$manager" in
    dnf) dnf -q versionlock list 2>/dev/null | grep -q "^$1-[0-9]" ;;
    zypper) zypper --non-interactive locks 2>/dev/null | awk -F'|' -v pkg="$1" '{ gsub(/ /, "", $2) } $2 == pkg { found = 1 } END { exit !found }' ;;
    *) return 1 ;;
  esac
}

# Installs version $2 of $1, unholding it for the install and holding it again after. A
# hold taken off is remembered in ROLLGATE_STATE_DIR until it stands again, so a redo after
# a cut between the two puts it back.
install_pinned() {
  local pkg=$1 version=$2 relock="$ROLLGATE_STATE_DIR/relock-$1"
  if [ "$(installed "$pkg")" = "$version" ]; then
    log "$pkg $version already installed"
    if [ -f "$relock" ]; then hold "$pkg"; rm -f "$relock"; fi
    return
  fi
  case "$manager" in
    apt)
      touch "$relock"
      $SUDO apt-mark unhold "$pkg" >/dev/null
      $SUDO apt-get install -y --allow-change-held-packages "$pkg=$version" 9>&- ;;
    dnf)
      if locked "$pkg"; then
        touch "$relock"
        $SUDO dnf -q -y versionlock delete "$pkg" >/dev/null
      fi
      $SUDO dnf -y --disableexcludes=kubernetes install "$pkg-$version" 9>&- ;;
    zypper)
      if locked "$pkg"; then
        touch "$relock"
        $SUDO zypper --non-interactive removelock "$pkg" >/dev/null
      fi
      $SUDO zypper --non-interactive install -y --oldpackage "$pkg=$version" 9>&- ;;
  esac
  if [ -f "$relock" ]; then hold "$pkg"; rm -f "$relock"; fi
}

# Holds $1 at its installed version.
hold() {
  case "$manager" in
    apt) $SUDO apt-mark hold "$1" >/dev/null ;;
    dnf) $SUDO dnf -q -y versionlock add "$1" >/dev/null ;;
    zypper) $SUDO zypper --non-interactive addlock "$1" >/dev/null ;;
  esac
}

upgrade_node() {
  [ "$role" = control-plane ] || [ "$role" = worker ] || die "--role must be control-plane or worker"
  if [ -z "$kubeadm" ]; then
    if [ "$role" = control-plane ]; then kubeadm=apply; else kubeadm=node; fi
  fi
  [ "$kubeadm" = apply ] || [ "$kubeadm" = node ] || die "--kubeadm must be apply or node"
  [ "$kubeadm" = node ] || [ "$role" = control-plane ] || die "kubeadm upgrade apply runs on a control plane only"
  is_version "$release" || die "--release must be MAJOR.MINOR.PATCH, got '$release'"
  refresh
  local pkg
  pkg=$(candidate kubeadm "$release")
  [ -n "$pkg" ] || die "kubeadm $release is not in the $(repository kubeadm)"
  install_pinned kubeadm "$pkg"
  local done_mark="$ROLLGATE_STATE_DIR/kubeadm-upgrade-$kubeadm-$release.done"
  if [ -f "$done_mark" ]; then
    log "kubeadm upgrade $kubeadm to $release already done"
  else
    if [ "$kubeadm" = apply ]; then
      $SUDO kubeadm upgrade apply -y "v$release" 9>&-
    else
      $SUDO kubeadm upgrade node 9>&-
    fi
    touch "$done_mark"
  fi
  install_pinned kubelet "$pkg"
  install_pinned kubectl "$pkg"
  $SUDO systemctl daemon-reload 9>&-
  $SUDO systemctl restart kubelet 9>&-
  log "node at $release ($role, kubeadm upgrade $kubeadm)"
}

# Downloads release $release of kubeadm, kubelet and kubectl into the package manager's
# cache, where the install finds them; the package manager checks each against the
# repository's metadata. Nothing is installed and no hold or lock is touched: apt and dnf
# are told to look past them for this download only; zypper downloads without its solver.
# A package that does not match its checksum is refused, naming it and both sums.
stage_packages() {
  is_version "$release" || die "--release must be MAJOR.MINOR.PATCH, got '$release'"
  refresh
  local pkg out status=0
  pkg=$(candidate kubeadm "$release")
  [ -n "$pkg" ] || refuse "kubeadm $release is not in the $(repository kubeadm)"
  case "$manager" in
    apt) out=$($SUDO apt-get install -y --download-only --allow-change-held-packages \
           "kubeadm=$pkg" "kubelet=$pkg" "kubectl=$pkg" 9>&- 2>&1) || status=$? ;;
    dnf) out=$($SUDO dnf -y --disableexcludes=kubernetes --disableplugin=versionlock install \
           --downloadonly "kubeadm-$pkg" "kubelet-$pkg" "kubectl-$pkg" 9>&- 2>&1) || status=$? ;;
    zypper) out=$($SUDO zypper --non-interactive download \
           "kubeadm=$pkg" "kubelet=$pkg" "kubectl=$pkg" 9>&- 2>&1) || status=$? ;;
  esac
  printf '%s\n' "$out"
  # zypper discards a package that fails its digest and still exits 0: the output says.
  local mismatch
  mismatch=$(checksum_mismatch <<<"$out")
  [ -n "$mismatch" ] || mismatch=$(local_rpm_mismatch <<<"$out")
  [ -z "$mismatch" ] || refuse "$mismatch"
  if [ "$status" -ne 0 ] || grep -q "^ABORT request" <<<"$out"; then
    die "$manager could not download kubeadm, kubelet and kubectl $pkg (exit $status)"
  fi
  log "kubeadm, kubelet and kubectl $pkg staged and verified"
}

# One line naming the file and both sums, out of a package manager's report of a download
# that does not match its checksum: apt's "Hash Sum mismatch" with its expected and
# received hashes, dnf's "checksum doesn't match. Calculated: … Expected: …", zypper's
# "Digest verification failed" with its expected and computed digests.
checksum_mismatch() {
  awk '
    /Failed to fetch/ { f = $0; sub(/.*Failed to fetch +/, "", f); sub(/ .*/, "", f); sub(/.*\//, "", f); file = f }
    /Hashes of expected file/ { side = "expected" }
    /Hashes of received file/ { side = "received" }
    side != "" && /SHA256:/ && !(side in sum) { s = $0; sub(/.*SHA256:/, "", s); sum[side] = s }
    /checksum doesn.t match/ {
      f = $0; sub(/:.*/, "", f); sub(/^.*\] */, "", f); file = f
      c = $0; sub(/.*Calculated: */, "", c); sub(/ .*/, "", c); sum["received"] = c
      e = $0; sub(/.*Expected: */, "", e); sub(/ .*/, "", e); sum["expected"] = e
    }
    /Digest verification failed for/ { f = $0; sub(/.*failed for file /, "", f); gsub(/[^A-Za-z0-9._+~-]/, "", f); file = f; digest = 1 }
    digest && /expected/ { e = $0; sub(/.*expected */, "", e); sum["expected"] = e }
    digest && /but got/ { g = $0; sub(/.*but got */, "", g); sum["received"] = g }
    END {
      if ("expected" in sum && "received" in sum)
        printf "%s does not match its checksum: the repository says %s, the download is %s\n", (file == "" ? "a package" : file), sum["expected"], sum["received"]
    }'
}

# dnf reads a local (file://) repository's packages in place and says only which one "has
# incorrect checksum": the sums are read here, the expected one from the repository's
# primary metadata, the other off the file.
local_rpm_mismatch() {
  local nevra dir primary expected actual
  nevra=$(sed -n 's/^Package "\([^"]*\)" from local repository.*incorrect checksum.*/\1/p' | head -n 1)
  [ -n "$nevra" ] || return 0
  dir=$(sed -n 's#^baseurl *= *file://##p' "$K8S_RPM_REPO" | head -n 1)
  for primary in "$dir"/repodata/*primary.xml.gz; do break; done
  if [ -z "$dir" ] || [ ! -f "$primary" ] || [ ! -f "$dir/$nevra.rpm" ]; then
    echo "$nevra.rpm does not match its checksum in $dir"
    return 0
  fi
  expected=$(zcat "$primary" | awk -v want="$nevra.rpm" '
    /<checksum / { c = $0; sub(/.*<checksum[^>]*>/, "", c); sub(/<.*/, "", c) }
    /<location / && index($0, "\"" want "\"") { print c; exit }')
  actual=$(sha256sum "$dir/$nevra.rpm" | awk '{ print $1 }')
  echo "$nevra.rpm does not match its checksum: the repository says $expected, the download is $actual"
}

upgrade_containerd() {
  is_version "$containerd" || die "--containerd must be MAJOR.MINOR.PATCH, got '$containerd'"
  refresh
  local pkg
  pkg=$(candidate "$CONTAINERD_PACKAGE" "$containerd")
  [ -n "$pkg" ] || die "$CONTAINERD_PACKAGE $containerd is not in the $(repository "$CONTAINERD_PACKAGE")"
  install_pinned "$CONTAINERD_PACKAGE" "$pkg"
  $SUDO systemctl restart containerd 9>&-
  log "containerd at $containerd"
}

# Points the Kubernetes repository (pkgs.k8s.io's `/v1.NN/deb/` or `/v1.NN/rpm/`) at the
# minor asked; the rest of the file (dnf's exclude line, the key) stays as it is.
rewrite_repo() {
  is_minor "$apt_minor" || die "--apt-minor must be MAJOR.MINOR, got '$apt_minor'"
  local file kind
  case "$manager" in
    apt) file=$K8S_APT_SOURCE kind=deb ;;
    dnf) file=$K8S_RPM_REPO kind=rpm ;;
    zypper) file=$K8S_ZYPP_REPO kind=rpm ;;
  esac
  [ -f "$file" ] || die "$file does not exist"
  if grep -q "/v$apt_minor/$kind" "$file"; then
    log "$manager repository already at v$apt_minor"
  else
    grep -qE "/v[0-9]+\\.[0-9]+/$kind" "$file" || die "$file has no /vX.Y/$kind repository line"
    # Edited as this user, read whole before tee truncates the file, and written through
    # tee: sudo needs a rule for `tee FILE` alone, not for a sed expression.
    local rewritten
    rewritten=$(sed -E "s#/v[0-9]+\\.[0-9]+/$kind#/v$apt_minor/$kind#g" "$file")
    printf '%s\n' "$rewritten" | $SUDO tee "$file" >/dev/null
    log "$manager repository now at v$apt_minor"
  fi
  refresh
}

plan() {
  is_version "$release" || die "--release must be MAJOR.MINOR.PATCH, got '$release'"
  $SUDO kubeadm upgrade plan
  local pkg
  pkg=$(candidate kubeadm "$release")
  echo "rollgate: kubeadm-candidate $pkg"
}

# A value of the node's os-release file (empty when unset).
os_field() {
  # shellcheck disable=SC1090
  (. "$OS_RELEASE" 2>/dev/null && printf '%s' "${!1:-}")
}

# The node's package manager, read off its os-release (apt when there is none); empty for
# an OS the script does not serve.
package_manager() {
  [ -r "$OS_RELEASE" ] || { echo apt; return; }
  case " $(os_field ID) $(os_field ID_LIKE) " in
    *" debian "*|*" ubuntu "*) echo apt ;;
    *" rhel "*|*" fedora "*|*" centos "*) echo dnf ;;
    *" suse "*|*" opensuse "*|*" sles "*) echo zypper ;;
    *) echo "" ;;
  esac
}

# Refuses (exit 3) a node whose OS the script does not serve, naming it and its package
# manager.
supported_os() {
  [ -z "$manager" ] || return 0
  echo "node-upgrade: runs $(os_field NAME) $(os_field VERSION_ID) (no apt, dnf or zypper): the kubeadm node script supports apt (Debian, Ubuntu), dnf (RHEL, Rocky, Alma, Fedora) and zypper (SUSE, openSUSE) nodes" >&2 || true
  exit 3
}

# Not as root: every privileged command the script and a reboot run must be allowed by
# sudo without a password (deploy/node/sudoers); names each that is not.
sudo_rules() {
  [ -n "$SUDO" ] || return 0
  local rule missing=() packages=()
  case "$manager" in
    apt) packages=("apt-get update -q"
           "apt-get install -y --allow-change-held-packages kubeadm=1.0.0-1.1"
           "apt-get install -y --download-only --allow-change-held-packages kubeadm=1.0.0-1.1 kubelet=1.0.0-1.1 kubectl=1.0.0-1.1"
           "apt-mark hold kubeadm" "apt-mark unhold kubeadm" "tee $K8S_APT_SOURCE") ;;
    dnf) packages=("dnf -q -y makecache"
           "dnf -y --disableexcludes=kubernetes install kubeadm-1.0.0-150500.1.1"
           "dnf -y --disableexcludes=kubernetes --disableplugin=versionlock install --downloadonly kubeadm-1.0.0-150500.1.1 kubelet-1.0.0-150500.1.1 kubectl-1.0.0-150500.1.1"
           "dnf -q -y versionlock add kubeadm" "dnf -q -y versionlock delete kubeadm"
           "tee $K8S_RPM_REPO") ;;
    zypper) packages=("zypper --non-interactive refresh"
           "zypper --non-interactive install -y --oldpackage kubeadm=1.0.0-150500.1.1"
           "zypper --non-interactive download kubeadm=1.0.0-150500.1.1 kubelet=1.0.0-150500.1.1 kubectl=1.0.0-150500.1.1"
           "zypper --non-interactive addlock kubeadm" "zypper --non-interactive removelock kubeadm"
           "tee $K8S_ZYPP_REPO") ;;
  esac
  for rule in "${packages[@]}" \
      "kubeadm upgrade node" "kubeadm upgrade apply -y v1.0.0" "kubeadm upgrade plan" \
      "systemctl daemon-reload" "systemctl restart kubelet" "systemctl restart containerd" \
      "systemctl reboot" \
      "install -d -m 0755 -o $(id -un) $ROLLGATE_STATE_DIR"; do
    # shellcheck disable=SC2086
    sudo -n -l $rule >/dev/null 2>&1 || missing+=("$rule")
  done
  [ "${#missing[@]}" -eq 0 ] || die "sudo does not let $(id -un) run these without a password: $(printf '%s; ' "${missing[@]}")add deploy/node/sudoers to /etc/sudoers.d"
}

check() {
  local tool tools
  case "$manager" in
    apt) tools="apt-get apt-cache apt-mark dpkg-query" ;;
    dnf) tools="dnf rpm" ;;
    zypper) tools="zypper rpm" ;;
  esac
  for tool in $tools flock kubeadm systemctl timeout; do
    command -v "$tool" >/dev/null || die "$tool is missing on this node"
  done
  sudo_rules
  if [ -n "$release" ]; then
    is_version "$release" || die "--release must be MAJOR.MINOR.PATCH, got '$release'"
    [ -n "$(candidate kubeadm "$release")" ] \
      || refuse "kubeadm $release is not in the $(repository kubeadm), as its lists stand"
  fi
  log "ok: kubeadm $(installed kubeadm), kubelet $(installed kubelet)"
}

# What `rollgate detect` reads, as `apt-cache madison` lines (`kubeadm | VERSION | FROM`):
# the lists as the node's own periodic refresh left them; first, the package manager, so
# that detection reads the next minor's repository in the layout this node reads.
available() {
  echo "rollgate: package-manager $manager"
  case "$manager" in
    apt) apt-cache madison kubeadm ;;
    dnf) dnf -q -C list --showduplicates --disableexcludes=kubernetes kubeadm 2>/dev/null \
           | awk '$1 ~ /^kubeadm\./ && $3 !~ /^@/ { print "   kubeadm | " $2 " | " $3 }' ;;
    zypper) zypper_versions kubeadm | awk '{ print "   kubeadm | " $1 " | " $2 }' ;;
  esac
}

case "$manager_named" in
  "") manager=$(package_manager) ;;
  apt|dnf|zypper) manager=$manager_named ;;
  *) die "--manager must be apt, dnf or zypper, got '$manager_named'" ;;
esac
supported_os
case "$action" in
  "") lock_node; upgrade_node ;;
  available) available ;;
  containerd) lock_node; upgrade_containerd ;;
  apt-minor) lock_node; rewrite_repo ;;
  plan) plan ;;
  stage) lock_node; stage_packages ;;
  check) check ;;
esac
