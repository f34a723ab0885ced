#!/usr/bin/env bash
# Installs promtool (the alert-rule tests run it) from Debian's prometheus package,
# the smallest one that ships it, without starting or enabling a Prometheus server.
set -euo pipefail
command -v promtool >/dev/null 2>&1 && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
  # invoke-rc.d asks this script whether to start services; 101 = no.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  added_policy=1
fi
trap '[ "$added_policy" = 1 ] && $SUDO rm -f "$policy"' EXIT
./scripts/system-deps.sh prometheus
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
