#!/usr/bin/env bash
# reboot-managers.sh: names each reboot manager of the node's own that would reboot it
# while rollgate has it in hand: Flatcar's locksmithd, unattended-upgrades with
# Automatic-Reboot, dnf-automatic with a reboot setting. rollgate runs it over SSH in the
# pre-flight of upgrades and reboots (bash -s); it changes nothing.
# Environment (for unusual layouts): DNF_AUTOMATIC_CONF (default /etc/dnf/automatic.conf),
# APT_CONFIG (apt's own).
# Exit status: 0 none; 5 some, one line each on stdout, saying what to change.
set -u

DNF_AUTOMATIC_CONF=${DNF_AUTOMATIC_CONF:-/etc/dnf/automatic.conf}
found=()

active() { systemctl is-active --quiet "$1" 2>/dev/null; }

if active locksmithd.service; then
  found+=("locksmithd is active: Flatcar reboots the node itself after an update; set REBOOT_STRATEGY=off in /etc/flatcar/update.conf (and systemctl stop locksmithd), and let rollgate reboot (reboot.sentinel_preset = \"flatcar\")")
fi
if active apt-daily-upgrade.timer && command -v apt-config >/dev/null \
    && apt-config dump Unattended-Upgrade::Automatic-Reboot 2>/dev/null \
       | grep -Eqi '^Unattended-Upgrade::Automatic-Reboot "(true|yes|1|on)";'; then
  found+=("unattended-upgrades reboots the node itself (Unattended-Upgrade::Automatic-Reboot \"true\"): set it to \"false\" and let rollgate reboot")
fi
if { active dnf-automatic.timer || active dnf-automatic-install.timer; } \
    && grep -Eq '^[[:space:]]*reboot[[:space:]]*=[[:space:]]*(when-needed|when-changed)' "$DNF_AUTOMATIC_CONF" 2>/dev/null; then
  found+=("dnf-automatic reboots the node itself (reboot = when-needed or when-changed in $DNF_AUTOMATIC_CONF): set reboot = never and let rollgate reboot")
fi
[ "${#found[@]}" -eq 0 ] && exit 0
printf '%s\n' "${found[@]}"
exit 5
