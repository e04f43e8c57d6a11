#!/usr/bin/env bash
# A block's quantize step fanned out as parts over the node's workers (daemon/parts.c,
# workers/worker_parts.c, the parts messages of proto/wire.md), against a real redis-server
# on a random loopback port and quantd with --workers cpu:1, cpu:2 and cpu:3:
#   - a GPTQ job on a dense model and on a MoE model (gen-model --experts, whose experts'
#     Hessians are factored by parts of the step "factor") writes the same bytes whatever the
#     number of workers (every output file compared with cmp; the report
#     with its run-dependent fields left out), and the same as job.workers 1 (no fan-out);
#     with one worker the lead keeps its parts in memory (no fan-out either);
#   - with 2 or more workers the logs show parts run by a worker other than the lead, and the
#     status carried the parts in flight at some point (the stream's events; quantctl status
#     prints them);
#   - with memory-limit-mb holding the job's estimate but not one more part, no helper takes a
#     part (parts_held_back) and the bytes are the same;
#   - a straggler (a helper that holds its parts, heartbeating, until the test releases it):
#     the lead runs backups of its parts and the job ends, with the same bytes, before the
#     helper reports (late, ignored);
#   - the passes over a dense block cut into capture parts (a calibration of two forward
#     batches), true-sequential and not, and with calibration.shards 2 (each part sums its
#     shard's Hessians): the same bytes as the lead's run in memory;
#   - a helper whose report comes after its job has ended (deaf to part_stop and cancel): the
#     report is ignored, the ended job untouched, and the helper runs the next job's parts;
#   - kill -9 of a helper while it holds a part: the part goes back to pending
#     (part_requeued), or the lead's backup covers it, and the job still ends with the same bytes.
# Nothing here asserts a duration: every wait is a bounded poll.
set -u
DC_NAME=qdd-parts
. "$(dirname "$0")/daemon_common.sh"
. "$(dirname "$0")/parts_common.sh"
"$B/quantctl" gen-model --out "$T/dense" --layers 3 --hidden 128 >/dev/null || fail "gen-model dense"
"$B/quantctl" gen-model --out "$T/moe" --layers 2 --hidden 64 --experts 4 >/dev/null || fail "gen-model moe"
# For the kill: a MoE block has enough parts for every worker.
"$B/quantctl" gen-model --out "$T/slow" --layers 3 --hidden 128 --experts 8 >/dev/null || fail "gen-model slow"

# job ID MODEL [extra JSON]
job() {
    echo "{\"id\":\"$1\",\"model\":\"$T/$2\",\"output\":\"$T/out/$1\",\"method\":\"gptq\",\"group_size\":32,\"backend\":\"cpu\",\"calibration\":{\"path\":\"$T/calib.json\",\"samples\":8,\"seq_len\":64}${3:-}}"
}

# [HEARTBEAT=S] start_daemon N [ARGS]: quantd with N CPU workers, log in $T/d.log (appended)
start_daemon() {
    local n=$1; shift
    echo "=== quantd --workers cpu:$n" >>"$T/d.log"
    "$B/quantd" --redis "redis://127.0.0.1:$PORT" --node parts --allow-root "$T" --workers "cpu:$n" \
        --heartbeat "${HEARTBEAT:-1}" --node-ttl-ms 2000 --lease-ttl-ms 3000 "$@" >>"$T/d.log" 2>&1 &
    DPID=$!
    # Every worker ready before a job comes: a job finished before its helpers had started
    # would show no part run by them.
    wait_for 120 workers_ready "$n" || fail "the $n workers of quantd did not start"
}
# workers_ready N: the last started daemon's log has N worker_ready lines
workers_ready() { [ "$(awk '/^=== quantd/ { c = 0 } /worker_ready/ { c++ } END { print c + 0 }' "$T/d.log")" -ge "$1" ]; }
stop_daemon() {
    kill -TERM "$DPID"
    wait_for 60 sh -c "! kill -0 $DPID 2>/dev/null" || fail "quantd did not stop on SIGTERM"
    wait "$DPID" 2>/dev/null
    DPID=
}
# run_job ID: submits $T/ID.json and waits for it to end done
run_job() {
    R LPUSH qjobs "$(cat "$T/$1.json")" >/dev/null
    wait_for 600 final "$1" || fail "$1 did not end: $(R HGETALL "qjob:$1" | tr '\n' ' ')"
    state_is "$1" done || fail "$1 ended $(R HGET "qjob:$1" state): $(R HGET "qjob:$1" error)"
}
# daemon_parts ID: the parts of ID the daemon saw done (its part_done lines carry lead=);
# helper_parts ID: of them, those a worker other than the lead ran
daemon_parts() { grep -c "part_done job=$1 .* lead=[01] " "$T/d.log"; }
helper_parts() { grep -c "part_done job=$1 .* lead=0 " "$T/d.log"; }

for model in dense moe; do
    for n in 1 2 3; do
        id="$model-w$n"
        job "$id" "$model" >"$T/$id.json"
        echo "== $model: --workers cpu:$n"
        start_daemon "$n"
        run_job "$id"
        if [ "$n" -eq 1 ]; then
            # Alone, the lead keeps its parts in memory: no fan-out at all (task.fanout false).
            grep -q "parts_open job=$id " "$T/d.log" && fail "$id: a fan-out on a daemon with one worker"
        else
            [ "$(daemon_parts "$id")" -gt 0 ] || fail "$id: no part ran through the daemon"
            # Every part here ends well: none is logged as failed.
            grep -q "part_failed job=$id " "$T/d.log" && fail "$id: a part that ended well logged as failed: $(grep -m1 "part_failed job=$id " "$T/d.log")"
        fi
        if [ "$n" -ge 2 ]; then
            [ "$(helper_parts "$id")" -gt 0 ] || fail "$id: every part ran on the lead with $n workers"
            grep -q "part_run worker=cpu-[0-9] job=$id " "$T/d.log" || fail "$id: no worker logged a part"
            R XRANGE "qjob:$id:events" - + | grep -q '"parts":\[{"worker":"cpu-' || fail "$id: the status never listed a part in flight"
            # A MoE block's experts are quantized together: their Hessians are factored by
            # parts of their own (step factor) before the row parts.
            if [ "$model" = moe ]; then
                grep -q "parts_open job=$id block=[0-9]* step=factor " "$T/d.log" || fail "$id: no factor step went out as parts"
                # Its experts' capture passes are cut by experts: capture parts, some a helper's.
                grep -q "part_done job=$id block=[0-9]* step=capture .* lead=0 " "$T/d.log" ||
                    fail "$id: no helper ran a capture part of the experts"
            fi
        fi
        # Once over, no part is listed.
        [ -z "$(R HGET "qjob:$id" parts)" ] || fail "$id: parts left in the status: $(R HGET "qjob:$id" parts)"
        stop_daemon
        if [ "$n" -gt 1 ]; then
            same_bytes "$T/out/$model-w1" "$T/out/$id" || fail "$id: output differs from one worker's"
        fi
    done
    # job.workers 1: the lead keeps the step (no parts message at all), the same bytes.
    id="$model-one"
    job "$id" "$model" ',"workers":1' >"$T/$id.json"
    echo "== $model: job.workers 1 on cpu:2"
    start_daemon 2
    run_job "$id"
    grep -q "parts_open job=$id " "$T/d.log" && fail "$id: a fan-out with job.workers 1"
    stop_daemon
    same_bytes "$T/out/$model-w1" "$T/out/$id" || fail "$id: output differs with job.workers 1"
done

echo "== the passes over the block cut into capture parts: the same bytes"
# 5 sequences of 1024 tokens are two forward batches (4 + 1): a dense block's passes that
# run a projection before their group's input go out as parts of the step capture (the
# float pass and the last forward without true-sequential; the o and down passes with it).
"$B/quantctl" gen-model --out "$T/long" --layers 2 --hidden 128 --max-pos 1024 >/dev/null || fail "gen-model long"
python3 -c 'import json, random, sys; r = random.Random(2); json.dump([r.randrange(3, 128) for _ in range(6000)], open(sys.argv[1], "w"))' \
    "$T/calib-long.json" || fail "calibration ids"
long_job() {   # long_job ID [extra JSON] [extra calibration JSON]
    echo "{\"id\":\"$1\",\"model\":\"$T/long\",\"output\":\"$T/out/$1\",\"method\":\"gptq\",\"group_size\":32,\"backend\":\"cpu\",\"calibration\":{\"path\":\"$T/calib-long.json\",\"samples\":5,\"seq_len\":1024${3:-}}${2:-}}"
}
# shards: calibration.shards 2, a shard a batch, each summing its own Hessians in a part.
for v in seq nseq shards; do
    extra=; cal=; [ "$v" = nseq ] && extra=',"true_sequential":false'; [ "$v" = shards ] && cal=',"shards":2'
    long_job "long-$v-ref" "$extra,\"workers\":1" "$cal" >"$T/long-$v-ref.json"
    long_job "long-$v" "$extra" "$cal" >"$T/long-$v.json"
done
start_daemon 2
for v in seq nseq shards; do
    run_job "long-$v-ref"
    run_job "long-$v"
    grep -q "parts_open job=long-$v block=[0-9]* step=capture " "$T/d.log" || fail "long-$v: no pass went out as capture parts"
    [ "$(helper_parts "long-$v")" -gt 0 ] || fail "long-$v: every part ran on the lead"
    same_bytes "$T/out/long-$v-ref" "$T/out/long-$v" || fail "long-$v: output differs from the lead's in-memory run"
done
stop_daemon

echo "== memory-limit-mb that holds the job but no helper's part: the lead runs every part"
id=dense-mem
job "$id" dense >"$T/$id.json"
"$B/quantctl" estimate --json "$T/$id.json" >"$T/$id-est.json" || fail "quantctl estimate of $id"
# The limit: the job's peak and half a part, in MiB, rounded up.
LIMIT=$(python3 -c 'import json,sys; e=json.load(open(sys.argv[1])); print(-(-(e["peak_ram_bytes"] + e["part_ram_bytes"] // 2) >> 20))' "$T/$id-est.json")
start_daemon 2 --memory-limit-mb "$LIMIT"
run_job "$id"
grep -q "parts_held_back job=$id .*reason=memory" "$T/d.log" || fail "$id: no helper held back for memory (limit $LIMIT MiB)"
[ "$(helper_parts "$id")" -eq 0 ] || fail "$id: a helper ran a part over memory-limit-mb"
stop_daemon
same_bytes "$T/out/dense-w1" "$T/out/$id" || fail "$id: output differs under memory-limit-mb"

echo "== a straggler: the lead's backup of a part a helper holds does not wait for the helper"
# QUANTD_FAULT_PART_HOLD (fault-hook builds, as the README's test command makes): every part
# a helper is handed waits until the file exists, its heartbeats going on. The job must end
# while the helper still holds its part, every held part done by the lead's backup.
if grep -q '^QUANTD_FAULT_HOOKS:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null; then
    id=dense-straggler
    job "$id" dense >"$T/$id.json"
    QUANTD_FAULT_PART_HOLD="$T/release" start_daemon 2
    run_job "$id"
    grep -q "fault_part_hold worker=cpu-[0-9] job=$id " "$T/d.log" || fail "$id: no helper held a part"
    grep -q "part_backup job=$id .* helper=cpu-" "$T/d.log" || fail "$id: the lead ran no backup"
    [ "$(helper_parts "$id")" -eq 0 ] || fail "$id: a held helper reported a part before its release"
    same_bytes "$T/out/dense-w1" "$T/out/$id" || fail "$id: output differs with the lead's backups"
    # The lead's backup done, the daemon stops the helper's copy (part_stop): the held helper
    # stops without its release, and its report is late.
    grep -q "part_stop job=$id .* worker=cpu-" "$T/d.log" || fail "$id: no part_stop sent to the held helper"
    stopped() { grep -q "part_stopped worker=cpu-[0-9] job=$id " "$T/d.log" && grep -q "part_late job=$id .* worker=cpu-" "$T/d.log"; }
    wait_for 120 stopped || fail "$id: the held helper did not stop its copy on part_stop"
    touch "$T/release"
    stop_daemon

    echo "== a helper's report after its job has ended"
    # QUANTD_FAULT_PART_HOLD_DEAF=1: the held helper hears neither part_stop nor the job's
    # end, so the job ends (its held part done by the lead's backup) while the helper still
    # holds that part. Released, it reports for a job that is over: the report is ignored
    # (part_late), the job's status is not touched, and the helper takes the next job's parts.
    id=dense-late
    job "$id" dense >"$T/$id.json"
    QUANTD_FAULT_PART_HOLD="$T/release-late" QUANTD_FAULT_PART_HOLD_DEAF=1 start_daemon 2
    run_job "$id"
    HW=$(sed -n "s/.*fault_part_hold worker=\(cpu-[0-9]\) job=$id .* deaf=1 .*/\1/p" "$T/d.log" | head -1)
    [ -n "$HW" ] || fail "$id: no helper held a part without hearing part_stop"
    grep -q "part_backup job=$id .* helper=$HW" "$T/d.log" || fail "$id: the lead ran no backup of $HW's part"
    grep -q "part_late job=$id " "$T/d.log" && fail "$id: a report came while the helper was held"
    [ -z "$(R HGET "qjob:$id" parts)" ] || fail "$id: parts left in the ended job's status: $(R HGET "qjob:$id" parts)"
    touch "$T/release-late"
    wait_for 120 grep -q "part_late job=$id .* worker=$HW " "$T/d.log" || fail "$id: $HW's report after the job's end was not ignored"
    [ "$(R HGET "qjob:$id" state)" = done ] || fail "$id: the late report changed the ended job: $(R HGET "qjob:$id" state)"
    [ -z "$(R HGET "qjob:$id" parts)" ] || fail "$id: the late report wrote parts into the ended job's status"
    job dense-after dense >"$T/dense-after.json"
    run_job dense-after
    [ "$(helper_parts dense-after)" -gt 0 ] || fail "dense-after: no helper ran a part after $HW's late report"
    stop_daemon
    same_bytes "$T/out/dense-w1" "$T/out/$id" || fail "$id: output differs with a late helper"
    same_bytes "$T/out/dense-w1" "$T/out/dense-after" || fail "dense-after: output differs"
else
    echo "SKIP: the straggler case needs QUANTD_FAULT_HOOKS"
fi

echo "== kill -9 a helper holding a part: the part is pending again, the bytes the same"
job slow-ref slow ',"workers":1' >"$T/slow-ref.json"
"$B/quantctl" quantize "$T/slow-ref.json" >"$T/slow-ref.log" 2>&1 || fail "the reference run of slow"
job slow-kill slow >"$T/slow-kill.json"
# A heartbeat of 2 s: the stopped helper below is killed by the test before the watchdog
# (3 silent heartbeats) would; either way its part must go back to pending.
HEARTBEAT=2 start_daemon 3
# since_start: this daemon's lines of the log
since_start() { awk '/^=== quantd/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' "$T/d.log"; }
R LPUSH qjobs "$(cat "$T/slow-kill.json")" >/dev/null
lead_known() { [ -n "$(R HGET qjob:slow-kill worker)" ]; }
wait_for 120 lead_known || fail "slow-kill got no worker"
LEAD=$(R HGET qjob:slow-kill worker)
H=cpu-0; [ "$LEAD" = cpu-0 ] && H=cpu-1
HPID=$(since_start | sed -n "s/.*worker_spawn worker=$H pid=\([0-9]*\).*/\1/p" | tail -1)
[ -n "$HPID" ] || fail "no pid for $H"
# Frozen before the first fan-out opens, the helper is handed a part it cannot finish.
kill -STOP "$HPID"
holds_part() { R HGET qjob:slow-kill parts | grep -q "\"worker\":\"$H\""; }
wait_for 300 holds_part || { kill -CONT "$HPID"; fail "$H was never handed a part of slow-kill"; }
# quantctl status prints the parts in flight, one line each.
"$B/quantctl" status slow-kill --redis "redis://127.0.0.1:$PORT" >"$T/status.txt" 2>&1
grep -q "^part: *$H: block [0-9]* \(quantize\|factor\|capture\) part [0-9]*" "$T/status.txt" ||
    { kill -CONT "$HPID"; fail "quantctl status shows no part of $H: $(cat "$T/status.txt")"; }
kill -9 "$HPID"
wait_for 600 final slow-kill || fail "slow-kill did not end after the helper's kill"
state_is slow-kill done || fail "slow-kill ended $(R HGET qjob:slow-kill state): $(R HGET qjob:slow-kill error)"
grep -q "worker_exit worker=$H pid=$HPID" "$T/d.log" || fail "the helper's death not logged"
# Its part is pending again, or the lead's backup of it goes on or already ended (the lead
# backs up a part held longest once it has nothing else to do).
grep -q "part_requeued job=slow-kill .* worker=$H \|part_backup job=slow-kill .* helper=$H " "$T/d.log" ||
    fail "the killed helper's part was neither requeued nor backed up by the lead"
[ "$(R HGET qjob:slow-kill attempts)" = 1 ] || fail "the helper's death restarted the job: attempts $(R HGET qjob:slow-kill attempts)"
stop_daemon
same_bytes "$T/out/slow-ref" "$T/out/slow-kill" || fail "slow-kill's output differs after the helper's kill"
# The sanitized builds report to the log: nothing may have been reported.
grep -q "Sanitizer\|runtime error:" "$T/d.log" && fail "a sanitizer report in the log"
echo "PASS"
