#!/usr/bin/env bash
# Chaos: kill -9 of the worker and of the daemon at three points of a GPTQ job (during block
# 0, mid-job, during the final write), and SIGTERM mid-job. After each, the job must end
# done with an output byte-identical, file by file, to an uninterrupted run of the same job
# (quantd_report.json compared without its timings), nothing left in the processing list,
# no lease left. The SIGTERM'd daemon must exit 0 and hand the job back to the queue with
# its checkpoint; a restarted daemon resumes it.
. "$(dirname "$0")/chaos_common.sh"

make_assets && make_big_model || { echo "FAIL: could not make the test model"; exit 1; }
ref_output gptq gptq_job || { echo "FAIL: the uninterrupted reference run failed"; exit 1; }

worker_kill() {
    local point=$1 id="wk-$1"
    start_redis
    start_daemon d1 n1
    push "$(gptq_job "$id" "$C/$id")"
    wait_for 60 at_point "$id" "$point" || fail "$id never reached $point: $(hash_dump "$id")"
    local w; w=$(worker_pid "$DPID")
    [ -n "$w" ] || fail "no worker"
    local where; where=$(stage_of "$id")
    kill -9 "$w"
    note "worker $w killed at stage/block: $where"
    check_recovered "$id" n1
    grep -q worker_exit "$C/d1.log" || fail "the worker's death was not logged"
    check_identical "$id" gptq
}
daemon_kill() {
    local point=$1 id="dk-$1"
    start_redis
    start_daemon d1 n1
    local d1=$DPID
    push "$(gptq_job "$id" "$C/$id")"
    wait_for 60 at_point "$id" "$point" || fail "$id never reached $point: $(hash_dump "$id")"
    local w; w=$(worker_pid "$d1")
    [ -n "$w" ] && track "$w"
    local where; where=$(stage_of "$id")
    kill -9 "$d1"
    wait "$d1" 2>/dev/null
    note "daemon $d1 killed at stage/block: $where"
    # Its worker loses its pipe; it must not outlive the daemon for long.
    if [ -n "$w" ] && ! wait_for 30 dead "$w"; then
        fail "the dead daemon's worker $w is still running 30 s later"
    fi
    start_daemon d2 n1
    check_recovered "$id" n1
    check_identical "$id" gptq
}
sigterm() {
    local id=st
    start_redis
    start_daemon d1 n1
    local d1=$DPID
    push "$(gptq_job "$id" "$C/$id")"
    wait_for 60 at_point "$id" mid || fail "$id never reached block 4: $(hash_dump "$id")"
    stop_daemon "$d1" 60
    local rc=$?
    [ $rc = 0 ] || fail "quantd exited $rc on SIGTERM"
    state_is "$id" queued || fail "$id not handed back: $(hash_dump "$id")"
    R LRANGE qjobs 0 -1 | grep -q "\"id\":\"$id\"" || fail "$id not back on the queue"
    [ "$(R LLEN qjobs:processing:n1)" = 0 ] || fail "processing list not empty after SIGTERM"
    local nb; nb=$(next_block "$C/$id")
    [ -n "$nb" ] && [ "$nb" -ge 1 ] || fail "no checkpoint kept (next_block=${nb:-none})"
    note "handed back with next_block=$nb"
    start_daemon d2 n1
    check_recovered "$id" n1
    check_identical "$id" gptq
    grep -q "resume job=$id next_block=$nb\|resume.*job=$id" "$C/d2.log" || note "(no resume line in the log)"
}

for p in block0 mid write; do
    eval "case_worker_kill_$p() { worker_kill $p; }"
    run_case "worker-kill9-$p" "case_worker_kill_$p"
done
for p in block0 mid write; do
    eval "case_daemon_kill_$p() { daemon_kill $p; }"
    run_case "daemon-kill9-$p" "case_daemon_kill_$p"
done
run_case sigterm-resume sigterm
finish
