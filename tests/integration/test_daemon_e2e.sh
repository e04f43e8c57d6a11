#!/usr/bin/env bash
# quantd end to end against a real redis-server on a random loopback port (persistence off):
# submit with redis-cli LPUSH and see queued -> running -> done with ordered progress events
# and a valid output; invalid jobs land in qjobs:failed with the reason; kill -9 a worker
# mid-job (byte-identical output); cancel; SIGTERM exits 0 and the job resumes on restart;
# kill -9 the daemon and a restarted one resumes; Redis restarted empty mid-job; two
# daemons on one Redis never run a job twice and a dead node's job is reclaimed.
set -u
B="${QUANTD_BUILD_DIR:-}"
for x in quantd quantd-worker quantctl; do
    [ -x "$B/$x" ] || { echo "SKIP: $B/$x not built"; exit 77; }
done
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { echo "SKIP: no redis-server"; exit 77; }
T=$(mktemp -d /tmp/qdd-e2e-XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; [ -n "${RP:-}" ] && kill -9 "$RP" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$T"/*.log; do echo "== $f"; grep -v "layer_done\|progress stage" "$f" | tail -40; done >&2
    exit 1
}
now() { date +%s%N | cut -c1-13; }

PORT=$((20000 + RANDOM % 30000))
start_redis() {
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
    RP=$!
    for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && return 0; sleep 0.05; done
    fail "redis-server did not start"
}
R() { redis-cli -p "$PORT" "$@"; }
# start_daemon NAME NODE [extra args]: pid in $DPID
start_daemon() {
    local name=$1 node=$2; shift 2
    "$B/quantd" --redis "redis://127.0.0.1:$PORT" --node "$node" --allow-root "$T" --workers cpu:1 \
        --heartbeat 1 --node-ttl-ms 2000 --lease-ttl-ms 3000 "$@" >>"$T/$name.log" 2>&1 &
    DPID=$!
    PIDS+=("$DPID")
}
# wait_for SECS CMD...: polls until CMD succeeds
wait_for() { local s=$1; shift; local end=$(( $(now) + s * 1000 )); while [ "$(now)" -lt $end ]; do "$@" && return 0; sleep 0.05; done; return 1; }
state_is() { [ "$(R HGET "qjob:$1" state)" = "$2" ]; }
block_ge() { local b; b=$(sed -n 's/.*"next_block"[^0-9]*\([0-9]*\).*/\1/p' "$T/$1/.quantd/state.json" 2>/dev/null); [ -n "$b" ] && [ "$b" -ge "$2" ]; }
job() { echo "{\"id\":\"$1\",\"model\":\"$T/model\",\"output\":\"$T/$1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"$2}"; }
worker_pid() { pgrep -P "$1" quantd-worker | head -1; }

"$B/quantctl" gen-model --out "$T/model" --layers 12 --hidden 256 >/dev/null || fail "gen-model"
# The reference output: an uninterrupted run in the foreground.
job ref "" >"$T/ref.json"
"$B/quantctl" quantize "$T/ref.json" >"$T/ref.log" 2>&1 || fail "reference run"
same_as_ref() { for f in "$T/ref"/*.safetensors; do cmp -s "$f" "$T/$1/$(basename "$f")" || return 1; done; }

start_redis
start_daemon d1 n1
D1=$DPID

echo "== submit, events in order, valid output"
R SUBSCRIBE qjobs:events >"$T/events.txt" 2>&1 &
SUBP=$!; PIDS+=("$SUBP")
sleep 0.2
R LPUSH qjobs "$(job j1 "")" >/dev/null
wait_for 60 state_is j1 done || fail "j1 did not finish: $(R HGETALL qjob:j1 | tr '\n' ' ')"
same_as_ref j1 || fail "j1 output differs from the foreground run"
[ -s "$T/j1/quantd_report.json" ] || fail "no report"
[ "$(R HGET qjob:j1 output)" = "$T/j1" ] || fail "output field"
# The live status carries the last committed block's cost (stages, passes, bytes).
R HGET qjob:j1 last_block | grep -q '"stages":{"load":' || fail "last_block in the status: $(R HGET qjob:j1 last_block)"
# The status carries the estimate the job was admitted under (what quantctl estimate prints),
# and the report summary its resources: that estimate beside the measured peaks.
job j1 "" >"$T/j1.json"
"$B/quantctl" estimate --json "$T/j1.json" >"$T/j1-estimate.json" || fail "quantctl estimate"
python3 - "$(R HGET qjob:j1 estimate)" "$(R HGET qjob:j1 report)" "$T/j1-estimate.json" <<'PY' || fail "estimate in the status: $(R HGET qjob:j1 estimate)"
import json, sys
est, rep, cli = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.load(open(sys.argv[3]))
assert est == {"peak_ram_bytes": cli["peak_ram_bytes"], "disk_bytes": cli["disk_bytes"],
               "mlp_act_kept_bytes": cli["mlp_act_kept_bytes"], "part_disk_bytes": cli["part_disk_bytes"],
               "part_ram_bytes": cli["part_ram_bytes"], "part_lead_bytes": cli["part_lead_bytes"]}, (est, cli)
assert est["part_disk_bytes"] > 0 and est["part_ram_bytes"] > 0, est   # workers "all": parts counted
res = rep["resources"]
assert res["estimate"] == est, res
assert res["measured"]["peak_rss_bytes"] > 0 and res["measured"]["peak_disk_bytes"] > 0, res
assert abs(res["ratio"]["disk"] - est["disk_bytes"] / res["measured"]["peak_disk_bytes"]) < 0.001, res
PY
R LLEN qjobs:processing:n1 | grep -qx 0 || fail "j1 left in the processing list"
[ "$(R TTL qjob:j1)" -gt 0 ] || fail "no retention TTL on the finished hash"
# Stream: queued, running, progress ..., done, with progress non-decreasing.
R XRANGE qjob:j1:events - + | grep '^{' >"$T/stream.txt"
python3 - "$T/stream.txt" <<'PY' || fail "events out of order"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
states = [e["state"] for e in ev]
assert states[0] == "queued" and states[-1] == "done", states
assert "running" in states and states.index("running") < len(states) - 1
first_run = states.index("running")
assert all(s == "running" for s in states[first_run:-1]), states
prog = [e.get("progress", 0) for e in ev if e["state"] == "running"]
assert all(b >= a for a, b in zip(prog, prog[1:])), prog
assert sum(1 for e in ev if e["type"] == "progress") >= 12
PY
grep -q '"id":"j1"' "$T/events.txt" || fail "nothing published on qjobs:events"

echo "== invalid jobs go to qjobs:failed with the reason"
R LPUSH qjobs 'not json' >/dev/null
R LPUSH qjobs '{"id":"bad1","model":"/etc","output":"/etc/out","method":"rtn"}' >/dev/null
R LPUSH qjobs "$(job bad2 ',"bits":5')" >/dev/null
wait_for 10 sh -c "[ \$(redis-cli -p $PORT LLEN qjobs:failed) -ge 3 ]" || fail "invalid jobs not failed"
R LRANGE qjobs:failed 0 -1 | grep -q 'invalid JSON' || fail "bad JSON reason"
R LRANGE qjobs:failed 0 -1 | grep -q 'outside every allowed root' || fail "allow-list reason"
state_is bad2 failed && R HGET qjob:bad2 error | grep -q 'job.bits' || fail "bad2 status hash reason"

echo "== kill -9 the worker mid-job: completes byte-identical"
R LPUSH qjobs "$(job j2 "")" >/dev/null
wait_for 30 block_ge j2 3 || fail "j2 did not start"
W=$(worker_pid "$D1"); [ -n "$W" ] || fail "no worker"
kill -9 "$W"
wait_for 60 state_is j2 done || fail "j2 did not finish after the worker kill: $(R HGET qjob:j2 error)"
same_as_ref j2 || fail "j2 output differs after the worker kill"
grep -q worker_exit "$T/d1.log" || fail "worker death not logged"

echo "== cancel"
R LPUSH qjobs "$(job j3 "")" >/dev/null
wait_for 30 block_ge j3 2 || fail "j3 did not start"
R SET qjob:j3:cancel "test" >/dev/null; R PUBLISH qjobs:cancel j3 >/dev/null
wait_for 30 state_is j3 cancelled || fail "j3 not cancelled: $(R HGET qjob:j3 state)"
[ -f "$T/j3/.quantd/state.json" ] || fail "cancelled job lost its checkpoint"

echo "== SIGTERM: exit 0, job back on the queue, resumes on restart"
R LPUSH qjobs "$(job j4 "")" >/dev/null
wait_for 30 block_ge j4 2 || fail "j4 did not start"
kill -TERM "$D1"
wait "$D1"; rc=$?
[ $rc = 0 ] || fail "quantd exited $rc on SIGTERM"
state_is j4 queued || fail "j4 not handed back: $(R HGET qjob:j4 state)"
R LRANGE qjobs 0 -1 | grep -q '"id":"j4"' || fail "j4 not on the queue"
start_daemon d1 n1
D1=$DPID
wait_for 60 state_is j4 done || fail "j4 did not resume"
same_as_ref j4 || fail "j4 output differs after SIGTERM + restart"

echo "== kill -9 the daemon: the restarted one resumes"
R LPUSH qjobs "$(job j5 "")" >/dev/null
wait_for 30 block_ge j5 2 || fail "j5 did not start"
W=$(worker_pid "$D1")
kill -9 "$D1"; [ -n "$W" ] && kill -9 "$W" 2>/dev/null
start_daemon d1 n1
D1=$DPID
wait_for 60 state_is j5 done || fail "j5 did not resume after kill -9: $(R HGETALL qjob:j5 | tr '\n' ' ')"
same_as_ref j5 || fail "j5 output differs"

echo "== Redis restarted empty mid-job"
R LPUSH qjobs "$(job j6 "")" >/dev/null
wait_for 30 block_ge j6 2 || fail "j6 did not start"
kill -9 "$RP"; wait "$RP" 2>/dev/null
start_redis
wait_for 60 state_is j6 done || fail "j6 did not finish after the Redis restart: $(R HGETALL qjob:j6 | tr '\n' ' ')"
same_as_ref j6 || fail "j6 output differs"
[ "$(R LLEN qjobs:processing:n1)" = 0 ] || fail "j6 left in processing"

echo "== two daemons: no job twice; a dead node's job is reclaimed"
start_daemon d2 n2
D2=$DPID
for i in $(seq 1 6); do R LPUSH qjobs "$(job m$i "")" >/dev/null; done
all_done() { for i in $(seq 1 6); do state_is m$i done || return 1; done; }
wait_for 120 all_done || fail "m jobs did not all finish"
for i in $(seq 1 6); do
    n=$(grep -h "job_start job=m$i " "$T/d1.log" "$T/d2.log" | wc -l)
    [ "$n" = 1 ] || fail "job m$i started $n times"
done
R LPUSH qjobs "$(job k1 "")" >/dev/null
wait_for 30 sh -c "[ -n \"\$(redis-cli -p $PORT HGET qjob:k1 node)\" ] && [ -f $T/k1/.quantd/state.json ]" || fail "k1 did not start"
owner=$(R HGET qjob:k1 node)
if [ "$owner" = n1 ]; then victim=$D1; else victim=$D2; fi
W=$(worker_pid "$victim")
kill -9 "$victim"; [ -n "$W" ] && kill -9 "$W" 2>/dev/null
wait_for 60 state_is k1 done || fail "k1 not reclaimed from dead node $owner: $(R HGETALL qjob:k1 | tr '\n' ' ')"
[ "$(R HGET qjob:k1 node)" != "$owner" ] || fail "k1 finished on the dead node?"
same_as_ref k1 || fail "k1 output differs"
grep -q jobs_reclaimed "$T"/d*.log || fail "no reclaim logged"
echo "PASS"
