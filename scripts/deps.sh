#!/usr/bin/env bash
# Installs the Debian packages quantd needs, only those missing. Idempotent; needs root
# or sudo when something is missing. Debian packages only (nothing downloaded at build time).
#   scripts/deps.sh          what building and running quantd needs
#   scripts/deps.sh --test   plus what the tests use (chromium for the dashboard tests and
#                            iproute2's ss to see it connect, systemd for systemd-analyze verify)
set -euo pipefail
PKGS=(build-essential cmake pkg-config libopenblas-dev liblapacke-dev libcjson-dev
      libpcre2-dev libuv1-dev libhiredis-dev libmicrohttpd-dev libsystemd-dev
      redis-server redis-tools python3 curl)
if [ "${1:-}" = "--test" ]; then
  PKGS+=(chromium iproute2 systemd)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The redis-server package starts a system instance; our tests start their own on random ports.
