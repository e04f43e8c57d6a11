#!/usr/bin/env bash
# The dashboard against the real thing: a throwaway redis-server, quantd with its HTTP API
# and one CPU worker, and a real GPTQ job on a generated 12-block model pushed with
# redis-cli LPUSH. Headless Chromium loads the page served by quantd while the job runs; the
# job's progress bar must take several values and reach done, and the workers table must
# list the daemon's worker. Skips (77) without chromium, redis-server or curl.
set -euo pipefail
B=${QUANTD_BUILD_DIR:?}
CHROME=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$CHROME" ] || { echo "no chromium; skipping" >&2; exit 77; }
command -v redis-server >/dev/null && command -v curl >/dev/null || { echo "no redis-server or curl; skipping" >&2; exit 77; }
for x in quantd quantd-worker quantctl; do [ -x "$B/$x" ] || { echo "$B/$x not built; skipping" >&2; exit 77; }; done
tmp=$(mktemp -d /tmp/qdd-dash-XXXXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(port); HP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --loglevel warning >/dev/null &
RPID=$!
QPID=
cleanup() { for p in $QPID $RPID; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
R="redis-cli -p $RP"
for _ in $(seq 50); do $R ping >/dev/null 2>&1 && break; sleep 0.1; done

"$B/quantctl" gen-model --out "$tmp/model" --layers 12 --hidden 256 >/dev/null
python3 -c "import json,random; random.seed(1); json.dump({'tokens':[random.randrange(128) for _ in range(40000)]}, open('$tmp/ids.json','w'))"
"$B/quantd" --redis "redis://127.0.0.1:$RP" --node dash --allow-root "$tmp" --workers cpu:1 \
    --http "127.0.0.1:$HP" >"$tmp/quantd.log" 2>&1 &
QPID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HP/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$HP/readyz" >/dev/null || { tail -20 "$tmp/quantd.log" >&2; echo "quantd not ready" >&2; exit 1; }

job="{\"id\":\"dash2\",\"model\":\"$tmp/model\",\"output\":\"$tmp/out\",\"method\":\"gptq\",\"bits\":4,\"group_size\":32,\"calibration\":{\"path\":\"$tmp/ids.json\",\"samples\":64,\"seq_len\":128},\"backend\":\"cpu\"}"
$R LPUSH qjobs "$job" >/dev/null

out=$tmp/dom.html
timeout 90 "$CHROME" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
  --user-data-dir="$tmp/profile" --virtual-time-budget=3000 --run-all-compositor-stages-before-draw \
  --dump-dom "http://127.0.0.1:$HP/?job=dash2&once=1" >"$out" 2>"$tmp/chrome.log" || true
row=$(grep -o '<tr[^>]*data-id="dash2"[^>]*>' "$out" || true)
[ -n "$row" ] || { tail -20 "$tmp/quantd.log" >&2; head -c 2000 "$out" >&2; echo "test_dashboard_daemon: no row for the job" >&2; exit 1; }
echo "row: $row"
seen=$(sed -n 's/.*data-seen="\([^"]*\)".*/\1/p' <<<"$row")
n=$(tr ',' '\n' <<<"$seen" | sort -u | wc -l)
[ "$n" -ge 3 ] || { echo "test_dashboard_daemon: the bar did not move (seen: $seen)" >&2; exit 1; }
grep -q 'data-state="done"' <<<"$row" || { echo "test_dashboard_daemon: the job did not reach done: $row ($($R HGET qjob:dash2 state))" >&2; exit 1; }
grep -q 'data-worker="cpu-0"' "$out" || { echo "test_dashboard_daemon: the worker is missing from the page" >&2; exit 1; }
echo "test_dashboard_daemon: ok (progress seen: $seen)"
