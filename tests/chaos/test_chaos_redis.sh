#!/usr/bin/env bash
# Chaos: Redis goes away mid-job and comes back, with its data and without: SHUTDOWN SAVE
# then a restart that loads the dump; SHUTDOWN NOSAVE (no persistence: back empty); kill -9
# with an fsync-always append-only file (back with its data); kill -9 without persistence
# (back empty). Redis stays down for 2 s each time while the worker keeps computing. The
# job must end done in its status hash with its processing-list entry and lease gone, a job
# pushed after the restart must be taken and finish, and the first job's output must be
# byte-identical to an uninterrupted run.
. "$(dirname "$0")/chaos_common.sh"

make_assets && make_big_model && make_tiny_model || { echo "FAIL: could not make the test models"; exit 1; }
ref_output gptq gptq_job || { echo "FAIL: the uninterrupted reference run failed"; exit 1; }

# redis_restart MODE HOW: MODE as start_redis; HOW = save | nosave | kill9.
redis_restart() {
    local mode=$1 how=$2 id=rj
    start_redis "$mode"
    start_daemon d1 n1
    push "$(gptq_job "$id" "$C/$id")"
    wait_for 60 at_point "$id" mid || fail "$id never reached block 4: $(hash_dump "$id")"
    case $how in
        save) R SHUTDOWN SAVE >/dev/null ;;
        nosave) R SHUTDOWN NOSAVE >/dev/null ;;
        kill9) kill -9 "$RP" ;;
    esac
    wait_for 10 dead "$RP" || fail "redis-server did not stop"
    wait "$RP" 2>/dev/null
    local ups; ups=$(grep -c "redis_up conn=cmd" "$C/d1.log")
    note "redis stopped ($how) at stage/block $(sed -n 's/.*"next_block"[^0-9]*\([0-9]*\).*/next_block=\1/p' "$C/$id/.quantd/state.json" 2>/dev/null)"
    sleep 2
    start_redis "$mode"
    case $mode in
        none) [ "$(R DBSIZE)" = 0 ] || fail "redis came back with data in mode none" ;;
        *) [ -n "$(R HGET "qjob:$id" state)" ] || fail "redis came back without the job's hash in mode $mode" ;;
    esac
    wait_for 20 sh -c "[ \$(grep -c 'redis_up conn=cmd' '$C/d1.log') -gt $ups ]" ||
        fail "the daemon did not reconnect to the restarted redis-server within 20 s (no redis_up in its log; job $id is $(H "$id" state))"
    push "$(rtn_job after "$C/after")"
    check_recovered "$id" n1
    wait_for 60 final after || fail "the job pushed after the restart did not finish: $(hash_dump after); queue: $(R LLEN qjobs)"
    state_is after done || fail "the job pushed after the restart ended $(H after state): $(H after error)"
    check_identical "$id" gptq
}
case_save() { redis_restart rdb save; }
case_nosave() { redis_restart none nosave; }
case_kill9_aof() { redis_restart aof kill9; }
case_kill9_empty() { redis_restart none kill9; }

run_case redis-shutdown-save case_save
run_case redis-shutdown-nosave case_nosave
run_case redis-kill9-aof case_kill9_aof
run_case redis-kill9-empty case_kill9_empty
finish
