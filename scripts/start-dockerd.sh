#!/usr/bin/env bash
# Starts dockerd in the background when no engine answers, and waits until one does.
# The Docker runtime's tests need a real engine; CI machines and dev containers
# often have the package but no running daemon.
set -euo pipefail
WAIT_S="${DOCKERD_WAIT_S:-60}"
LOG="${DOCKERD_LOG:-/tmp/thaw-dockerd.log}"
if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "dockerd is not installed; run: make system-deps" >&2
  exit 1
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# setsid: the daemon must outlive this script and the terminal that ran it.
$SUDO setsid dockerd >"$LOG" 2>&1 < /dev/null &
for _ in $(seq 1 "$WAIT_S"); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "dockerd did not answer within ${WAIT_S}s; see $LOG" >&2
exit 1
