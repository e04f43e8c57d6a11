#!/usr/bin/env bash
# quantd when Redis answers the queue with an error reply, and job strings in its log (issue
# #33, items 7 and 11), against a real redis-server on a random loopback port:
#   - `SET qjobs oops` (a string where the queue list belongs): BLMOVE fails at once. The pop
#     backs off (100 ms doubling to 5 s): the BLMOVE calls Redis counts (INFO commandstats)
#     stay within what that backoff allows in the time that passed (a hot loop makes
#     thousands a second), the error is logged once (queue_error), /readyz answers 503 naming
#     it; DEL qjobs clears it by itself (queue_error_cleared with the count of repeats),
#     /readyz is 200 again and a job pushed then runs to done;
#   - an ACL user without permission on the queue key: the same with NOPERM (Redis counts
#     the refused calls as rejected_calls), and granting the key recovers without a restart;
#   - a job whose model path holds "\nlevel=error fake=1": one log line for it, the newline
#     written as \n, and every line of the log starts with a timestamp.
# No assertion is on a duration: the one bound computed from elapsed time is an upper bound
# on a count, which a slow machine only makes looser.
set -u
DC_NAME=qdd-qe
DC_LOG_FILTER="layer_done\|progress stage"
. "$(dirname "$0")/daemon_common.sh"

redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
RP=$!
wait_for 5 sh -c "redis-cli -p $PORT PING >/dev/null 2>&1" || fail "redis-server did not start"
"$B/quantctl" gen-model --out "$T/small" --layers 2 --hidden 64 >/dev/null || fail "gen-model"

state_is() { [ "$(R HGET "qjob:$1" state 2>/dev/null)" = "$2" ]; }
job() { echo "{\"id\":\"$1\",\"model\":\"$T/small\",\"output\":\"$T/$1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"}"; }
readyz_code() { curl -s -o "$T/readyz.body" -w '%{http_code}' "http://127.0.0.1:$HP/readyz"; }
ready() { [ "$(readyz_code)" = 200 ]; }
not_ready_with() { [ "$(readyz_code)" = 503 ] && grep -q "$1" "$T/readyz.body"; }
count() { grep -c "$1" "$T/d.log"; }
# calls_of CMD FIELD...: the sum of those fields of Redis's INFO commandstats line for CMD.
calls_of() {
    local cmd=$1; shift
    R INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_$cmd:\(.*\)/\1/p" |
        awk -F, -v want=" $* " '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (index(want, " " kv[1] " ")) n += kv[2] } }
                                END { print n + 0 }'
}
blmoves() { calls_of blmove calls; }
# EVALs the ACL refused: the recovery's reclaim script names the queue key, so with that key
# forbidden it is the step that fails (no pop runs before the recovery succeeded).
evals_refused() { calls_of eval rejected_calls; }
# The most attempts a backoff of 100 ms doubling to 5 s allows in MS milliseconds: the first
# at once, each next one after the delay.
allowed() {
    local ms=$1 n=1 d=100 t=0
    while :; do t=$((t + d)); [ $t -gt "$ms" ] && break; n=$((n + 1)); d=$((d * 2)); [ $d -gt 5000 ] && d=5000; done
    echo $n
}
start_quantd() {
    "$B/quantd" --redis "$1" --node qe --allow-root "$T" --workers cpu:1 --heartbeat 1 --node-ttl-ms 2000 \
        --lease-ttl-ms 3000 --http "127.0.0.1:$HP" >>"$T/d.log" 2>&1 &
    DPID=$!
}
# check_backoff WHAT COUNTER CMD ERR: the queue refused for a while: the attempts (COUNTER)
# bounded by the backoff, one log line, readyz 503 naming the error.
check_backoff() {
    local what=$1 counter=$2 cmd=$3 err=$4
    local b0 t0 b1 t1 n bound
    b0=$($counter); t0=$(now)
    wait_for 15 grep -q "queue_error cmd=$cmd err=\"$err" "$T/d.log" || fail "$what: no queue_error cmd=$cmd logged"
    wait_for 10 not_ready_with "$err" || fail "$what: readyz $(readyz_code) $(cat "$T/readyz.body"), not 503 naming $err"
    grep -q "Redis refuses the queue" "$T/readyz.body" || fail "$what: readyz reason: $(cat "$T/readyz.body")"
    # Let the backoff reach its cap, then count.
    sleep 7
    b1=$($counter); t1=$(now)
    n=$((b1 - b0)); bound=$(( $(allowed $((t1 - t0))) + 3 ))
    echo "   $what: $n $cmd attempts in $((t1 - t0)) ms (backoff allows $bound)"
    [ "$n" -ge 2 ] || fail "$what: $cmd not retried ($n calls)"
    [ "$n" -le "$bound" ] || fail "$what: $n $cmd attempts in $((t1 - t0)) ms: more than the backoff allows ($bound)"
    [ "$(count "queue_error ")" = 1 ] || fail "$what: queue_error logged $(count "queue_error ") times, not once"
    [ "$(wc -l <"$T/d.log")" -lt 200 ] || fail "$what: the log grew to $(wc -l <"$T/d.log") lines"
    not_ready_with "$err" || fail "$what: readyz recovered while the error persists"
}

echo "== SET qjobs oops: the pop backs off, logs once, readyz 503"
start_quantd "redis://127.0.0.1:$PORT"
wait_for 30 ready || fail "quantd not ready: $(cat "$T/readyz.body")"
R SET qjobs oops >/dev/null
check_backoff "wrong type" blmoves BLMOVE "WRONGTYPE"
R DEL qjobs >/dev/null
wait_for 15 grep -q "queue_error_cleared cmd=BLMOVE err=\"WRONGTYPE.* repeated=[1-9]" "$T/d.log" ||
    fail "the cleared error was not logged with its count"
wait_for 10 ready || fail "readyz not 200 after DEL qjobs: $(cat "$T/readyz.body")"
R LPUSH qjobs "$(job a1)" >/dev/null
wait_for 60 state_is a1 done || fail "a1 not done after the key was fixed: $(R HGETALL qjob:a1 | tr '\n' ' ')"
kill -TERM "$DPID"; wait "$DPID"; rc=$?; DPID=
[ $rc = 0 ] || fail "quantd exited $rc on SIGTERM"

echo "== an ACL user without permission on the queue key"
if R ACL SETUSER qd on '>qdpw' '~qjobs:*' '~qjob:*' '&*' '+@all' 2>/dev/null | grep -q OK; then
    : >"$T/d.log"
    start_quantd "redis://qd:qdpw@127.0.0.1:$PORT"
    b0=$(blmoves)
    check_backoff "ACL" evals_refused "EVAL reclaim" "NOPERM"
    [ "$(blmoves)" = "$b0" ] || fail "BLMOVE ran before the processing list was recovered"
    R ACL SETUSER qd '~qjobs' >/dev/null
    wait_for 15 grep -q "queue_error_cleared cmd=EVAL reclaim err=\"NOPERM.* repeated=[1-9]" "$T/d.log" || fail "NOPERM did not clear"
    wait_for 10 ready || fail "readyz not 200 after the ACL was fixed: $(cat "$T/readyz.body")"
    R LPUSH qjobs "$(job a2)" >/dev/null
    wait_for 60 state_is a2 done || fail "a2 not done after the ACL was fixed: $(R HGETALL qjob:a2 | tr '\n' ' ')"
else
    echo "   (no ACL in this redis-server: skipped)"
fi

echo "== a newline in a job's path is one log line"
before=$(count "fake=1")
# Outside every allowed root: refused at admission with the path in the reason.
R LPUSH qjobs '{"id":"nl1","model":"/elsewhere/m\nlevel=error fake=1","output":"'"$T"'/nl1","method":"rtn"}' >/dev/null
wait_for 30 state_is nl1 failed || fail "nl1 not refused: $(R HGETALL qjob:nl1 | tr '\n' ' ')"
# Inside the root but absent: the worker fails it, and its lines carry the path too.
R LPUSH qjobs '{"id":"nl2","model":"'"$T"'/m\nlevel=error fake=1","output":"'"$T"'/nl2","method":"rtn","backend":"cpu"}' >/dev/null
wait_for 60 state_is nl2 failed || fail "nl2 did not fail: $(R HGETALL qjob:nl2 | tr '\n' ' ')"
sleep 0.5
[ "$(grep "fake=1" "$T/d.log" | grep -c "job_rejected")" = 1 ] || fail "nl1: not one job_rejected line: $(grep "fake=1" "$T/d.log")"
grep "job_rejected" "$T/d.log" | grep "fake=1" | grep -qF 'm\nlevel=error fake=1' || fail "the newline is not written as \\n"
[ "$(count "fake=1")" -gt "$before" ] || fail "no line names the path"
grep -q '^level=error' "$T/d.log" && fail "a forged line: $(grep '^level=error' "$T/d.log")"
bad=$(grep -v '^[0-9]\{4\}-[0-9][0-9]-[0-9][0-9]T[0-9:.]*Z [A-Z]* ' "$T/d.log" | grep -v "^==\|^ *$" | head -3)
[ -z "$bad" ] || fail "log lines without a timestamp: $bad"
kill -TERM "$DPID"; wait "$DPID"; rc=$?; DPID=
[ $rc = 0 ] || fail "quantd exited $rc on SIGTERM"
grep -q "ERROR: LeakSanitizer\|ERROR: AddressSanitizer\|runtime error:" "$T/d.log" && fail "sanitizer report"
echo "PASS"
