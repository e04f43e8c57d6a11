#!/usr/bin/env bash
# systemd/ files: the unit passes `systemd-analyze verify` (with stand-in binaries, since
# the real ones are not installed here), holds the settings issue 6 requires, and the
# sysusers/tmpfiles/config files parse. Skips (77) without systemd-analyze.
set -euo pipefail
SRC=${QUANTD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
UNIT=$SRC/systemd/quantd.service
fail() { echo "test_systemd: $*" >&2; exit 1; }

# The settings the issue asks for, checked literally so an edit cannot drop one.
for want in '^Type=notify$' '^Restart=on-failure$' '^KillMode=mixed$' '^OOMPolicy=continue$' \
            '^NoNewPrivileges=yes$' '^ProtectSystem=strict$' '^ReadWritePaths=' '^PrivateTmp=yes$' \
            '^DeviceAllow=char-nvidia-frontend rw$' '^DeviceAllow=char-nvidia-uvm rw$' \
            '^DeviceAllow=char-nvidia-caps rw$' '^SupplementaryGroups=.*video' '^SupplementaryGroups=.*render' \
            '^TimeoutStopSec=' '^User=quantd$'; do
  grep -Eq "$want" "$UNIT" || fail "quantd.service lacks $want"
done
for bad in '^PrivateDevices=yes' '^MemoryDenyWriteExecute=yes' '^DynamicUser=yes'; do
  if grep -Eq "$bad" "$UNIT"; then fail "quantd.service must not set $bad (it breaks CUDA)"; fi
done
# TimeoutStopSec must leave room for a block checkpoint: at least 5 minutes.
ts=$(sed -n 's/^TimeoutStopSec=//p' "$UNIT")
case "$ts" in *min) [ "${ts%min}" -ge 5 ] || fail "TimeoutStopSec=$ts is too short";; *) fail "TimeoutStopSec=$ts: use minutes";; esac
grep -q '^u quantd ' "$SRC/systemd/quantd.sysusers.conf" || fail "sysusers: no quantd user"
grep -q '^m quantd video' "$SRC/systemd/quantd.sysusers.conf" || fail "sysusers: quantd not in video"
grep -q '^m quantd render' "$SRC/systemd/quantd.sysusers.conf" || fail "sysusers: quantd not in render"
grep -q '^d /var/lib/quantd ' "$SRC/systemd/quantd.tmpfiles.conf" || fail "tmpfiles: no state dir"

# Every option in the example config must be one the daemon knows.
if [ -n "${QUANTD_BUILD_DIR:-}" ] && [ -x "$QUANTD_BUILD_DIR/quantd" ]; then
  names=$(sed -n 's/^[[:space:]]*\([a-z-]*\)[[:space:]]*=.*/\1/p' "$SRC/systemd/quantd.conf" | sort -u)
  help=$("$QUANTD_BUILD_DIR/quantd" --help 2>&1 || true)
  for n in $names; do grep -q -- "--$n" <<<"$help" || fail "quantd.conf: '$n' is not a quantd option"; done
fi

command -v systemd-analyze >/dev/null || { echo "test_systemd: systemd-analyze not installed; skipping verify" >&2; exit 77; }
# verify wants the ExecStart binaries to exist: point them at stand-ins in a temp copy.
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sed -e "s|/usr/sbin/quantd|/bin/true|" "$UNIT" > "$tmp/quantd.service"
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$tmp/quantd.service" 2>&1) || {
  echo "$out" >&2; fail "systemd-analyze verify failed"; }
# verify prints problems as warnings without failing; unknown keys are the ones that matter.
if grep -Ei "unknown (key|lvalue|section)|failed to parse|invalid" <<<"$out" | grep -v "redis-server.service"; then
  fail "systemd-analyze reported problems"
fi
echo "test_systemd: ok"
