#!/usr/bin/env bash
# The dashboard in a real headless Chromium: with a job in flight (status and events written
# to Redis the way the daemon writes them, over a few seconds), the page served at / must
# show the job's progress bar moving and the job reaching done. Serves with quantd's HTTP
# layer through test_http --serve. Skips (77) without chromium or redis-server.
set -euo pipefail
B=${QUANTD_BUILD_DIR:?}
CHROME=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$CHROME" ] || { echo "no chromium; skipping" >&2; exit 77; }
command -v redis-server >/dev/null || { echo "no redis-server; skipping" >&2; exit 77; }
tmp=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(port); HP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --loglevel warning >/dev/null &
RPID=$!
SPID=; FPID=
cleanup() { for p in $FPID $SPID $RPID; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
R="redis-cli -p $RP"
for _ in $(seq 50); do $R ping >/dev/null 2>&1 && break; sleep 0.1; done
"$B/tests/test_http" --serve "$HP" "$RP" 2>"$tmp/serve.log" &
SPID=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$HP/readyz" >/dev/null 2>&1 && break; sleep 0.1; done

# The job: queued, then 8 progress steps (with a layer error each), then done.
$R hset qjob:dash1 v 1 id dash1 state queued progress 0 >/dev/null
$R zadd qjobs:index 1 dash1 >/dev/null
step() {  # state progress block
  local ev="{\"v\":1,\"type\":\"progress\",\"id\":\"dash1\",\"state\":\"$1\",\"progress\":$2,\"block\":$3,\"blocks\":8,\"stage\":\"quantize\",\"layer_error\":0.0$3}"
  $R hset qjob:dash1 state "$1" progress "$2" block "$3" blocks 8 stage quantize >/dev/null
  $R xadd qjob:dash1:events '*' event "$ev" >/dev/null
  $R publish qjobs:events "$ev" >/dev/null
}
# The steps start once the page is connected (an established connection to the server, polled
# up to 600 times), not after a fixed time: a slow Chromium start on a loaded machine must not
# miss them.
connected() { [ "$(ss -Htn state established "( sport = :$HP )" 2>/dev/null | wc -l)" -ge 1 ]; }
( for _ in $(seq 600); do connected && break; sleep 0.1; done; sleep 1
  for i in 1 2 3 4 5 6 7; do step running "0.$((i * 125 / 10))" "$i"; sleep 0.6; done; step done 1 7 ) &
FPID=$!

# --dump-dom prints the DOM once the virtual-time budget is spent; the page keeps its event
# streams open, so give real time too (timeout) and take the last dump.
out=$tmp/dom.html
timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
  --user-data-dir="$tmp/profile" --virtual-time-budget=3000 --run-all-compositor-stages-before-draw \
  --dump-dom "http://127.0.0.1:$HP/?job=dash1&once=1" >"$out" 2>"$tmp/chrome.log" || true
row=$(grep -o '<tr[^>]*data-id="dash1"[^>]*>' "$out" || true)
[ -n "$row" ] || { cat "$tmp/chrome.log" >&2; head -c 2000 "$out" >&2; echo "test_dashboard: no row for the job" >&2; exit 1; }
echo "row: $row"
seen=$(sed -n 's/.*data-seen="\([^"]*\)".*/\1/p' <<<"$row")
n=$(tr ',' '\n' <<<"$seen" | sort -u | wc -l)
[ "$n" -ge 3 ] || { echo "test_dashboard: the bar did not move (seen: $seen)" >&2; exit 1; }
grep -q 'data-state="done"' <<<"$row" || { echo "test_dashboard: the job did not reach done: $row" >&2; exit 1; }
grep -q 'data-progress="1.0000"' <<<"$row" || { echo "test_dashboard: the bar is not full: $row" >&2; exit 1; }
grep -q 'data-worker="cuda-0"' "$out" || { echo "test_dashboard: workers table missing" >&2; exit 1; }
echo "test_dashboard: ok (progress seen: $seen)"
