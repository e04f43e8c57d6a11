#!/usr/bin/env bash
# Chaos: load and duplicate ids.
#  - 40 RTN jobs on a tiny model pushed at once to a daemon with the HTTP API on, while two
#    pollers ask for their status the whole time (redis-cli HGETALL qjob:<id>, curl GET
#    /v1/jobs/<id>): every job ends done exactly once (one job_start, one done event, one
#    job_final) and no status request fails (redis-cli exits 0; HTTP answers 200, or 404 for
#    a job not taken yet).
#  - The same id pushed again while the first job is queued, while it runs and waits in the
#    queue behind it, and while it runs with a free slot (taken at once): the duplicate is
#    refused (qjobs:failed, the reason names the live id) and never runs, and the first
#    job's status, output and report are its own.
. "$(dirname "$0")/chaos_common.sh"

make_assets && make_big_model && make_tiny_model || { echo "FAIL: could not make the test models"; exit 1; }

N=40
load40() {
    local hp=$((20000 + RANDOM % 30000)) i
    start_redis
    if command -v curl >/dev/null; then
        start_daemon d1 n1 --http "127.0.0.1:$hp"
        wait_for 20 curl -sf -o /dev/null "http://127.0.0.1:$hp/healthz" || fail "HTTP API did not come up on $hp"
    else
        note "no curl: status requests through redis-cli only"
        start_daemon d1 n1
        hp=""
    fi
    local ids=()
    for i in $(seq 1 $N); do ids+=("l$i"); done
    local args=()
    for id in "${ids[@]}"; do args+=("$(rtn_job "$id" "$C/$id")"); done
    R LPUSH qjobs "${args[@]}" >/dev/null || fail "LPUSH of $N jobs failed"
    local t0; t0=$(now)
    # Pollers: bounded in count and time; every failure is one line in $C/poll.fail.
    : >"$C/poll.fail"
    (
        for k in $(seq 1 4000); do
            id=${ids[RANDOM % N]}
            redis-cli -p "$PORT" HGETALL "qjob:$id" >/dev/null 2>&1 || echo "redis HGETALL qjob:$id failed" >>"$C/poll.fail"
            [ -f "$C/poll.stop" ] && break
        done
        echo "$k" >"$C/poll.redis.count"
    ) &
    track $!
    if [ -n "$hp" ]; then
        (
            for k in $(seq 1 4000); do
                id=${ids[RANDOM % N]}
                code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$hp/v1/jobs/$id")
                case $code in 200|404) ;; *) echo "GET /v1/jobs/$id -> ${code:-no answer}" >>"$C/poll.fail" ;; esac
                [ -f "$C/poll.stop" ] && break
            done
            echo "$k" >"$C/poll.http.count"
        ) &
        track $!
    fi
    all_final() { local id; for id in "${ids[@]}"; do final "$id" || return 1; done; }
    wait_for 300 all_final
    local ok=$?
    touch "$C/poll.stop"
    wait_for 10 test -f "$C/poll.redis.count"
    [ -z "$hp" ] || wait_for 10 test -f "$C/poll.http.count"
    note "$N jobs final after $(( ($(now) - t0) / 1000 )) s; status requests: redis $(cat "$C/poll.redis.count" 2>/dev/null), http $(cat "$C/poll.http.count" 2>/dev/null || echo 0)"
    [ $ok = 0 ] || fail "not every job ended within 300 s: $(for id in "${ids[@]}"; do echo -n "$id=$(H "$id" state) "; done)"
    for id in "${ids[@]}"; do
        state_is "$id" done || fail "$id ended $(H "$id" state): $(H "$id" error)"
        local starts finals dones
        starts=$(grep -c "job_start job=$id " "$C/d1.log")
        finals=$(grep -c "job_final job=$id " "$C/d1.log")
        dones=$(R XRANGE "qjob:$id:events" - + | grep -c '"state":"done"')
        [ "$starts" = 1 ] && [ "$finals" = 1 ] && [ "$dones" = 1 ] ||
            fail "$id: job_start $starts times, job_final $finals times, $dones done events (want 1 each)"
        [ -s "$C/$id/model.safetensors" ] || fail "$id has no output"
    done
    [ ! -s "$C/poll.fail" ] || fail "$(wc -l <"$C/poll.fail") status requests failed: $(head -5 "$C/poll.fail")"
    [ "$(R LLEN qjobs:processing:n1)" = 0 ] && [ "$(R LLEN qjobs)" = 0 ] || fail "queue or processing list not empty"
    [ "$(R LLEN qjobs:failed)" = 0 ] || fail "payloads refused: $(R LRANGE qjobs:failed 0 2)"
    alive "$DPID" || fail "quantd died"
}

# dup_check ID DUPOUT: the duplicate (output DUPOUT) was refused and never ran; ID kept its
# own status, output and report.
dup_check() {
    local id=$1 dupout=$2
    wait_for 90 final "$id" || fail "$id did not finish: $(hash_dump "$id")"
    state_is "$id" done || fail "$id ended $(H "$id" state): $(H "$id" error)"
    wait_for 20 failed_has "$dupout" || fail "the duplicate is not in qjobs:failed: $(R LRANGE qjobs:failed 0 -1 | head -c 600)"
    local why; why=$(failed_reason "$dupout")
    note "duplicate refused: \"$why\""
    grep -Eqi "duplicate|already|live" <<<"$why" && grep -qF "$id" <<<"$why" || fail "the refusal does not name the live id $id: $why"
    sleep 2   # a duplicate that slipped through would show up by now
    state_is "$id" done || fail "$id's status was overwritten: $(hash_dump "$id")"
    [ "$(H "$id" output)" = "$C/$id" ] || fail "$id's output field is $(H "$id" output)"
    H "$id" spec | grep -qF "\"output\":\"$C/$id\"" || fail "$id's spec was overwritten: $(H "$id" spec)"
    H "$id" report | grep -q . || fail "$id has no report"
    [ ! -e "$dupout" ] || fail "the duplicate ran: $dupout exists"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(r["job"]["output"] != sys.argv[2])' \
        "$C/$id/quantd_report.json" "$C/$id" || fail "$id's report file names another output"
    [ "$(grep -c "job_start job=$id " "$C/d1.log")" = 1 ] || fail "$id started $(grep -c "job_start job=$id " "$C/d1.log") times"
    [ "$(R LLEN qjobs)" = 0 ] && [ "$(R LLEN qjobs:processing:n1)" = 0 ] || fail "queue or processing list not empty"
}
dup_queued() {
    start_redis
    start_daemon d1 n1
    push "$(gptq_job blocker "$C/blocker")"
    wait_for 30 state_is blocker running || fail "blocker did not start"
    push "$(rtn_job dq "$C/dq")"
    sleep 0.5
    state_in dq "" queued || fail "dq is $(H dq state), not queued"
    R LRANGE qjobs 0 -1 | grep -q '"id":"dq"' || fail "dq is not waiting in the queue"
    push "$(rtn_job dq "$C/dq-dup")"
    dup_check dq "$C/dq-dup"
}
dup_running_waits() {
    start_redis
    start_daemon d1 n1
    push "$(gptq_job dr "$C/dr")"
    wait_for 60 at_point dr mid || fail "dr never reached block 4: $(hash_dump dr)"
    push "$(gptq_job dr "$C/dr-dup")"
    dup_check dr "$C/dr-dup"
}
dup_running_taken() {
    start_redis
    start_daemon d1 n1 --max-jobs 2
    push "$(gptq_job dt "$C/dt")"
    wait_for 60 at_point dt mid || fail "dt never reached block 4: $(hash_dump dt)"
    push "$(gptq_job dt "$C/dt-dup")"
    dup_check dt "$C/dt-dup"
}

run_case load-40-jobs load40
run_case dup-while-queued dup_queued
run_case dup-while-running-queue-full dup_running_waits
run_case dup-while-running-slot-free dup_running_taken
finish
