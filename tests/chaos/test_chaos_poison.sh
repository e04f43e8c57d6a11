#!/usr/bin/env bash
# Chaos: poison jobs and stuck workers (issue #33), on a GPTQ job of the big model held at a
# known point (block 0) while it runs:
#   - worker-segv-twice: the job's worker dies of SIGSEGV; the task is retried (the job is not
#     failed), a fresh worker starts it (its task_start), and it dies of SIGBUS: the job ends
#     failed with an error starting "quarantined:" that names the job and the last signal, the
#     failed list (qjobs:failed) holds a record of its payload with that reason, nothing of it
#     is left in the queue or the processing list, and it is never started again while the
#     same daemon runs a good job to done;
#   - worker-kill9-twice: the same two deaths by a plain SIGKILL from outside (an operator, a
#     test; not the out-of-memory killer) are not held against the job: it ends done, with no
#     quarantine and no failed-list record;
#   - daemon-kill9-twice: the daemon running the job (node n1) is killed with -9 together with
#     its worker; a daemon restarted as n1 takes the node over when its key expires, recovers
#     its own processing list (daemon_deaths 1 in the status hash) and runs the job again; it
#     is killed the same way; a daemon of another node (n2) reclaims n1's list once n1's key
#     expires and quarantines the job instead of running it: failed, its error starting
#     "quarantined: the job was running when its daemon died, twice", a failed-list record,
#     nothing in the queue or processing lists, no lease, never started on n2, and n2 runs a
#     good job to done;
#   - cancel-stopped-worker: the job's worker is frozen (SIGSTOP; heartbeat 60 s so the
#     heartbeat watchdog stays out of it for 180 s) and the job cancelled (quantctl cancel)
#     with --cancel-grace 1: the daemon kills the worker ("did not stop within 1 s of a
#     cancel"), the job ends cancelled, a new worker (another pid) replaces it and runs a good
#     job to done.
# Without the quarantine the first case runs the job to done (retries are per block and
# max-retries is 3); without the reclaim's count of daemon deaths the third case runs the job
# on n2; without the cancel grace the fourth waits 180 s for the heartbeat watchdog (the wait
# here is bounded at 90 s). No duration is asserted: every wait is a bounded poll.
#
# The workers must die of the signal itself: the sanitizers' own SEGV/BUS handlers would turn
# it into an exit status (or SIGABRT), so they are switched off for these processes.
. "$(dirname "$0")/chaos_common.sh"

export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}handle_segv=0:handle_sigbus=0"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}handle_segv=0:handle_sigbus=0"
ulimit -c 0

make_assets && make_big_model && make_tiny_model || { echo "FAIL: could not make the test models"; exit 1; }

# task_starts ID LOG: how many tasks of ID the workers logging to LOG started.
task_starts() { local n; n=$(grep -c "task_start worker=[^ ]* job=$1 " "$2" 2>/dev/null); echo "${n:-0}"; }
more_starts() { [ "$(task_starts "$1" "$2")" -gt "$3" ]; }
# new_worker DAEMON OLD: DAEMON has a worker, and it is not OLD.
new_worker() { local w; w=$(worker_pid "$1"); [ -n "$w" ] && [ "$w" != "$2" ]; }
# computing ID: the worker reports ID in a compute stage (after the take wrote "queued" and
# the start "load", so this is the current run's progress).
computing() { [[ $(H "$1" stage) =~ ^(calibrate|quantize|forward)$ ]]; }
in_queue() { R LRANGE qjobs 0 -1 | grep -q "\"id\":\"$1\""; }
in_processing() { R LRANGE "qjobs:processing:$2" 0 -1 | grep -q "\"id\":\"$1\""; }
# good_job_on: a tiny RTN job runs to done on the case's daemon.
good_job_on() {
    push "$(rtn_job good "$C/good")"
    wait_for 120 final good || fail "the good job did not finish: $(hash_dump good)"
    state_is good "done" || fail "the good job ended $(H good state): $(H good error)"
}
# crash_twice SIGNAL1 SIGNAL2 ID: the job ID at block 0, its worker killed with SIGNAL1, the
# retry seen starting on a fresh worker, that worker killed with SIGNAL2. Leaves the second
# worker's pid in W2.
crash_twice() {
    local s1=$1 s2=$2 id=$3 w1 n0
    start_redis
    start_daemon d1 n1
    push "$(gptq_job "$id" "$C/$id")"
    wait_for 60 at_point "$id" block0 || fail "$id never reached block 0: $(hash_dump "$id")"
    w1=$(worker_pid "$DPID")
    [ -n "$w1" ] || fail "no worker"
    kill "-$s1" "$w1"
    wait_for 30 dead "$w1" || fail "worker $w1 survived SIG$s1"
    note "worker $w1 killed with SIG$s1 at $(stage_of "$id")"
    n0=$(task_starts "$id" "$C/d1.log")
    wait_for 30 grep -q "task_retry job=$id retry=1" "$C/d1.log" || fail "no retry of $id after the first death"
    state_is "$id" running || fail "$id not running after one death: $(hash_dump "$id")"
    wait_for 60 new_worker "$DPID" "$w1" || fail "no new worker after $w1 died"
    wait_for 60 more_starts "$id" "$C/d1.log" "$n0" || fail "the retry of $id never started: $(hash_dump "$id")"
    W2=$(worker_pid "$DPID")
    state_is "$id" running || fail "$id not running on the new worker: $(hash_dump "$id")"
    kill "-$s2" "$W2"
    wait_for 30 dead "$W2" || fail "worker $W2 survived SIG$s2"
    note "worker $W2 killed with SIG$s2 at $(stage_of "$id") (task_start count $(task_starts "$id" "$C/d1.log"))"
}

worker_segv_twice() {
    local id=poison err rec n1
    crash_twice SEGV BUS "$id"
    wait_for 60 final "$id" || fail "$id not final after its second crash: $(hash_dump "$id")"
    state_is "$id" failed || fail "$id ended $(H "$id" state), not failed: $(H "$id" error)"
    err=$(H "$id" error)
    note "error: $err"
    [[ $err == quarantined:* ]] || fail "$id's error does not start with 'quarantined:': $err"
    [[ $err == *SIGBUS* ]] || fail "$id's error does not name the last signal (SIGBUS): $err"
    grep -q "job_quarantined job=$id" "$C/d1.log" || fail "no job_quarantined line for $id"
    wait_for 10 failed_has "\"id\":\"$id\"" || fail "no failed-list record of $id: $(R LRANGE qjobs:failed 0 -1 | cut -c1-400)"
    rec=$(failed_reason "\"id\":\"$id\"")
    [[ $rec == quarantined:* ]] || fail "the failed-list record of $id has error '$rec'"
    ! in_queue "$id" || fail "$id is back on the queue"
    ! in_processing "$id" n1 || fail "$id left in the processing list"
    [ "$(R EXISTS "qjob:$id:lease")" = 0 ] || fail "lease of $id left behind"
    n1=$(task_starts "$id" "$C/d1.log")
    # The daemon goes on: a replacement worker runs a good job, and the quarantined job is not
    # started again meanwhile.
    wait_for 60 new_worker "$DPID" "$W2" || fail "no worker after $W2 died"
    good_job_on
    [ "$(task_starts "$id" "$C/d1.log")" = "$n1" ] || fail "$id was started again after its quarantine"
    state_is "$id" failed || fail "$id left the failed state: $(hash_dump "$id")"
    alive "$DPID" || fail "quantd died"
}

worker_kill9_twice() {
    local id=k9
    crash_twice KILL KILL "$id"
    # The whole job runs to its end here (8 blocks of GPTQ on a sanitizer build, maybe on a
    # loaded machine): a wider bound than check_recovered's own.
    wait_for 300 final "$id" || fail "$id did not finish: $(hash_dump "$id")"
    check_recovered "$id" n1
    [[ $(H "$id" error) != quarantined* ]] || fail "$id carries a quarantine error"
    grep -q "job_quarantined" "$C/d1.log" && fail "a kill -9 from outside quarantined $id"
    failed_has "\"id\":\"$id\"" && fail "$id has a failed-list record: $(failed_reason "\"id\":\"$id\"")"
    grep -q "worker cpu-0 was killed by signal 9 (SIGKILL)" "$C/d1.log" ||
        note "(the worker deaths were not logged as SIGKILL: $(grep -o 'killed by [^"]*' "$C/d1.log" | sort -u | tr '\n' ';'))"
}

# kill_daemon PID: kill -9 the daemon and its worker, and wait for both to be gone.
kill_daemon() {
    local d=$1 w
    w=$(worker_pid "$d")
    kill -9 "$d"
    [ -n "$w" ] && kill -9 "$w" 2>/dev/null
    wait "$d" 2>/dev/null
    wait_for 30 dead "$d" || fail "daemon $d survived kill -9"
    [ -z "$w" ] || wait_for 30 dead "$w" || fail "worker $w survived kill -9"
}

daemon_kill9_twice() {
    local id=dd n0 err rec
    start_redis
    start_daemon d1 n1
    push "$(gptq_job "$id" "$C/$id")"
    wait_for 60 at_point "$id" block0 || fail "$id never reached block 0 on d1: $(hash_dump "$id")"
    kill_daemon "$DPID"
    note "d1 killed at $(stage_of "$id")"
    state_is "$id" running || fail "$id not running when d1 died: $(hash_dump "$id")"
    in_processing "$id" n1 || fail "$id not in n1's processing list when d1 died"

    # d2, node n1 again: waits out d1's node key, recovers n1's list, runs the job again.
    start_daemon d2 n1
    wait_for 60 more_starts "$id" "$C/d2.log" 0 || fail "$id never started on d2: $(hash_dump "$id")"
    [ "$(H "$id" daemon_deaths)" = 1 ] || fail "daemon_deaths is '$(H "$id" daemon_deaths)' after one daemon death"
    grep -q "node_taken_over node=n1" "$C/d2.log" || note "(d2 did not log node_taken_over)"
    wait_for 60 computing "$id" || fail "$id not computing on d2: $(hash_dump "$id")"
    state_is "$id" running || fail "$id not running on d2: $(hash_dump "$id")"
    kill_daemon "$DPID"
    note "d2 killed at $(stage_of "$id")"
    in_processing "$id" n1 || fail "$id not in n1's processing list when d2 died"

    # d3, node n2: reclaims n1's list once n1's key expires, and quarantines the job.
    start_daemon d3 n2
    wait_for 60 final "$id" || fail "$id not final after its second daemon death: $(hash_dump "$id")"
    state_is "$id" failed || fail "$id ended $(H "$id" state), not failed: $(H "$id" error)"
    err=$(H "$id" error)
    note "error: $err"
    [[ $err == "quarantined: the job was running when its daemon died, twice"* ]] ||
        fail "$id's error is not the daemon-death quarantine: $err"
    [ "$(H "$id" daemon_deaths)" = 2 ] || fail "daemon_deaths is '$(H "$id" daemon_deaths)'"
    wait_for 10 failed_has "\"id\":\"$id\"" || fail "no failed-list record of $id: $(R LRANGE qjobs:failed 0 -1 | cut -c1-400)"
    rec=$(failed_reason "\"id\":\"$id\"")
    [[ $rec == quarantined:* ]] || fail "the failed-list record of $id has error '$rec'"
    # Its stream ends on the failed state, so watchers (quantctl watch, SSE) see it end.
    last=$(R XREVRANGE "qjob:$id:events" + - COUNT 1)
    [[ $last == *'"state":"failed"'* && $last == *quarantined* ]] ||
        fail "the last event of $id is not the quarantine: $last"
    ! in_queue "$id" || fail "$id was handed back to the queue"
    ! in_processing "$id" n1 || fail "$id left in n1's processing list"
    ! in_processing "$id" n2 || fail "$id in n2's processing list"
    [ "$(R EXISTS "qjob:$id:lease")" = 0 ] || fail "lease of $id left behind"
    good_job_on
    [ "$(task_starts "$id" "$C/d3.log")" = 0 ] || fail "$id was started on n2 after its quarantine"
    state_is "$id" failed || fail "$id left the failed state: $(hash_dump "$id")"
}

cancel_stopped_worker() {
    local id=cx w1
    start_redis
    start_daemon d1 n1 --heartbeat 60 --cancel-grace 1
    push "$(gptq_job "$id" "$C/$id")"
    wait_for 60 at_point "$id" block0 || fail "$id never reached block 0: $(hash_dump "$id")"
    w1=$(worker_pid "$DPID")
    [ -n "$w1" ] || fail "no worker"
    kill -STOP "$w1"
    note "worker $w1 stopped at $(stage_of "$id")"
    "$B/quantctl" cancel "$id" --reason "test: stuck worker" --redis "redis://127.0.0.1:$PORT" >"$C/cancel.out" 2>&1 ||
        fail "quantctl cancel failed: $(cat "$C/cancel.out")"
    wait_for 90 final "$id" || fail "$id not final 90 s after the cancel (its worker frozen): $(hash_dump "$id")"
    state_is "$id" cancelled || fail "$id ended $(H "$id" state), not cancelled: $(H "$id" error)"
    grep -q "worker_kill worker=cpu-0 pid=$w1 why=\"did not stop within 1 s of a cancel\"" "$C/d1.log" ||
        fail "no worker_kill for the cancel grace: $(grep "worker_kill" "$C/d1.log" | tail -3)"
    grep -q "stopped sending heartbeats" "$C/d1.log" && fail "the heartbeat watchdog, not the cancel grace, killed $w1"
    wait_for 30 dead "$w1" || fail "the frozen worker $w1 is still there"
    wait_for 60 new_worker "$DPID" "$w1" || fail "no new worker replaced $w1"
    note "worker $w1 replaced by $(worker_pid "$DPID")"
    good_job_on
    alive "$DPID" || fail "quantd died"
}

run_case worker-segv-twice worker_segv_twice
run_case worker-kill9-twice worker_kill9_twice
run_case daemon-kill9-twice daemon_kill9_twice
run_case cancel-stopped-worker cancel_stopped_worker
finish
