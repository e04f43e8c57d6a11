#!/usr/bin/env bash
# Load test: N (default 200) small jobs pushed onto the queue at once (one LPUSH pipeline),
# run by one quantd with W CPU workers (default 2). Checks that every job ends done, none is
# lost and none started twice, and prints queue-to-start latency (from the push to the
# job's started_ms) and throughput as a markdown row for bench/results/load.md.
# Usage: bench/load_test.sh [BUILD_DIR] [N] [W]
set -euo pipefail
B=$(cd "${1:-build/release}" && pwd)
N=${2:-200}
W=${3:-2}
T=$(mktemp -d /tmp/qdd-load-XXXXXX)
PORT=$((20000 + RANDOM % 30000))
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.05; done
"$B/quantctl" gen-model --out "$T/model" >/dev/null
"$B/quantd" --redis "redis://127.0.0.1:$PORT" --node load --allow-root "$T" --workers "cpu:$W" --log-level warn >"$T/quantd.log" 2>&1 &
PIDS+=($!)
sleep 0.5
for i in $(seq 1 "$N"); do
    printf 'LPUSH qjobs "{\\"id\\":\\"load-%d\\",\\"model\\":\\"%s/model\\",\\"output\\":\\"%s/out-%d\\",\\"method\\":\\"rtn\\",\\"group_size\\":32,\\"backend\\":\\"cpu\\"}"\n' "$i" "$T" "$T" "$i"
done >"$T/cmds.txt"
t0=$(date +%s%3N)
redis-cli -p "$PORT" <"$T/cmds.txt" >/dev/null
deadline=$((t0 + 600000))
while :; do
    done_n=0
    for i in $(seq 1 "$N"); do echo "HGET qjob:load-$i state"; done | redis-cli -p "$PORT" >"$T/states.txt"
    done_n=$(grep -cx done "$T/states.txt" || true)
    bad=$(grep -cxE 'failed|cancelled' "$T/states.txt" || true)
    [ "$bad" = 0 ] || { echo "load: $bad jobs failed" >&2; grep -m3 . "$T/quantd.log" >&2; exit 1; }
    [ "$done_n" = "$N" ] && break
    [ "$(date +%s%3N)" -lt $deadline ] || { echo "load: only $done_n/$N done" >&2; exit 1; }
    sleep 0.2
done
for i in $(seq 1 "$N"); do echo "HMGET qjob:load-$i started_ms finished_ms attempts"; done | redis-cli -p "$PORT" | paste - - - >"$T/times.txt"
[ "$(redis-cli -p "$PORT" LLEN qjobs)" = 0 ] && [ "$(redis-cli -p "$PORT" LLEN qjobs:processing:load)" = 0 ] || { echo "load: jobs left in lists" >&2; exit 1; }
[ "$(redis-cli -p "$PORT" LLEN qjobs:failed)" = 0 ] || { echo "load: jobs in qjobs:failed" >&2; exit 1; }
python3 - "$T/times.txt" "$t0" "$N" "$W" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
t0, n, w = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
start = sorted(int(r[0]) - t0 for r in rows)
end = max(int(r[1]) for r in rows)
att = [int(r[2]) for r in rows]
assert len(rows) == n and all(a == 1 for a in att), "a job ran more than once"
pct = lambda p: start[min(len(start) - 1, int(p * len(start)))]
print(f"| {n} | {w} | {pct(0.5)} | {pct(0.95)} | {start[-1]} | {(end - t0) / 1000:.1f} | {n / ((end - t0) / 1000):.1f} | 0 | 0 |")
PY
