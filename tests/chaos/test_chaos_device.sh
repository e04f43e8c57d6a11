#!/usr/bin/env bash
# Chaos: device errors (issue #20), faked without a GPU by the backend fault hook: the
# daemon runs with QUANTD_FAULT_INJECT in its environment, which every worker it spawns
# inherits (builds with -DQUANTD_FAULT_HOOKS=ON only; skipped otherwise).
#   mid-job  each worker's 200th gemm fails as a sticky CUDA error would (a block takes about
#            60): the worker fails its task as retryable and exits, the daemon starts a fresh
#            one, which resumes from the checkpoint; the job ends done with an output
#            byte-identical to an uninterrupted run.
#   at-once  every worker's first gemm fails: the job fails once its retries are spent, each
#            attempt on a fresh worker (the exiting one is given no retry), its error names the
#            call, file, line and device, and the daemon stays up.
. "$(dirname "$0")/chaos_common.sh"
grep -q '^QUANTD_FAULT_HOOKS:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null ||
    { echo "SKIP: $B was built without -DQUANTD_FAULT_HOOKS=ON"; exit 77; }

make_assets && make_big_model || { echo "FAIL: could not make the test model"; exit 1; }
ref_output gptq gptq_job || { echo "FAIL: the uninterrupted reference run failed"; exit 1; }

mid_job() {
    local id=dev-mid
    start_redis
    QUANTD_FAULT_INJECT=gemm:200 start_daemon d1 n1 --max-retries 10
    push "$(gptq_job "$id" "$C/$id")"
    # Each device error costs a worker restart (with the pool's backoff) and a resume.
    wait_for 300 final "$id" || fail "$id did not finish: $(hash_dump "$id")"
    check_recovered "$id" n1
    check_identical "$id" gptq
    local n
    n=$(grep -c "worker_device_error" "$C/d1.log")
    [ "$n" -ge 1 ] || fail "no worker reported a device error"
    grep -q "injected device fault" "$C/d1.log" || fail "the injected error is not in the log"
    note "$n device errors, each followed by a fresh worker; attempts=$(H "$id" attempts)"
}

at_once() {
    local id=dev-now
    make_tiny_model
    start_redis
    QUANTD_FAULT_INJECT=gemm:1 start_daemon d1 n1 --max-retries 2
    local d1=$DPID
    push "$(rtn_job "$id" "$C/$id")"
    wait_for 120 final "$id" || fail "$id did not finish: $(hash_dump "$id")"
    state_is "$id" failed || fail "$id ended $(H "$id" state), not failed"
    local err; err=$(H "$id" error)
    for want in "gemm failed: injected device fault" "backend_fault.c:" "cpu: " "after 2 retries"; do
        [[ $err == *"$want"* ]] || fail "the job's error lacks '$want': $err"
    done
    # Three attempts, each on a fresh worker: the exiting worker is given no retry.
    [ "$(grep -c worker_device_error "$C/d1.log")" = 3 ] ||
        fail "$(grep -c worker_device_error "$C/d1.log") workers met the device error, not 3 (one per attempt)"
    grep -q "exited with status" <<<"$err" && fail "a retry went to the exiting worker: $err"
    alive "$d1" || fail "the daemon died"
    worker_up "$d1" || wait_for 30 worker_up "$d1" || fail "no fresh worker after the failures"
}

run_case device-error-mid-job mid_job
run_case device-error-at-once at_once
finish
