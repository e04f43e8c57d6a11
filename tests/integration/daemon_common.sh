# Sourced by the shell tests that run quantd against a real redis-server
# (test_daemon_redis_restart.sh, test_daemon_reload.sh), after `set -u`:
#   - skips (exit 77) without quantd, quantd-worker and quantctl in QUANTD_BUILD_DIR ($B), or
#     without redis-server, redis-cli or curl;
#   - $T, a temporary directory named after $DC_NAME (default qdd), removed on exit, when the
#     daemon ($DPID) and redis-server ($RP) still running are killed too;
#   - $PORT (Redis) and $HP (the HTTP API): free loopback ports;
#   - fail MSG: prints MSG and the tail of $T/d.log (the daemon's log; lines matching
#     $DC_LOG_FILTER are left out, $DC_LOG_LINES of them shown), then exits 1;
#   - now (Unix ms), port (a free port), wait_for SECONDS CMD... (polls CMD every 50 ms until
#     it succeeds; 1 on time-out), R ARGS... (redis-cli on $PORT).
B="${QUANTD_BUILD_DIR:-}"
for x in quantd quantd-worker quantctl; do
    [ -x "$B/$x" ] || { echo "SKIP: $B/$x not built"; exit 77; }
done
command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v curl >/dev/null ||
    { echo "SKIP: no redis-server, redis-cli or curl"; exit 77; }
T=$(mktemp -d "/tmp/${DC_NAME:-qdd}-XXXXXX")
DPID=; RP=
cleanup() { [ -n "$DPID" ] && kill -9 "$DPID" 2>/dev/null; [ -n "$RP" ] && kill -9 "$RP" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    grep -v "${DC_LOG_FILTER:-^$}" "$T/d.log" 2>/dev/null | tail -"${DC_LOG_LINES:-40}" >&2
    exit 1
}
now() { date +%s%N | cut -c1-13; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { local s=$1; shift; local end=$(( $(now) + s * 1000 )); while [ "$(now)" -lt $end ]; do "$@" && return 0; sleep 0.05; done; return 1; }
PORT=$(port); HP=$(port)
R() { redis-cli -p "$PORT" "$@"; }
