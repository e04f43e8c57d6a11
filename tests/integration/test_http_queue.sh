#!/usr/bin/env bash
# Jobs submitted over the HTTP API while they wait on the queue, against a real quantd with
# one CPU worker and a real redis-server (issue #33, item 9):
#   - while the worker is busy, a POSTed job waits on the queue and is visible: GET
#     /v1/jobs/ID says queued, /v1/jobs?state=queued lists it;
#   - DELETE of a queued job takes it off the queue at once (200, cancelled); it never runs
#     and never leaves an output behind;
#   - a queued job is taken and runs to done as any other (the queued status the API wrote
#     is not read as a cancel or a duplicate);
#   - a cancelled job and a done one, resubmitted, run again to done.
# Waits are bounded loops, guards against a hang, not measurements.
set -u
DC_NAME=qdd-hq
DC_LOG_FILTER="layer_done\|progress stage"
. "$(dirname "$0")/daemon_common.sh"
U="http://127.0.0.1:$HP"
A='Authorization: Bearer tok'
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
RP=$!
wait_for 5 R PING >/dev/null || fail "redis-server did not start"
"$B/quantctl" gen-model --out "$T/big" --layers 32 --hidden 256 >/dev/null || fail "gen-model"
"$B/quantctl" gen-model --out "$T/small" --layers 2 --hidden 64 >/dev/null || fail "gen-model"
"$B/quantd" --redis "redis://127.0.0.1:$PORT" --node hq --allow-root "$T" --workers cpu:1 --max-jobs 1 \
    --http "127.0.0.1:$HP" --http-token tok >"$T/d.log" 2>&1 &
DPID=$!
wait_for 30 sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' $U/readyz)\" = 200 ]" || fail "readyz"

job() { echo "{\"id\":\"$1\",\"model\":\"$T/$2\",\"output\":\"$T/out-$1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"}"; }
post() { curl -s -o "$T/post.out" -w '%{http_code}' -H "$A" --data "$(job "$1" "$2")" "$U/v1/jobs"; }
state() { curl -s "$U/v1/jobs/$1" | sed -n 's/.*"state":"\([a-z]*\)".*/\1/p'; }
state_is() { [ "$(state "$1")" = "$2" ]; }

echo "== a long job occupies the only worker"
[ "$(post long big)" = 202 ] || fail "POST long: $(cat "$T/post.out")"
wait_for 60 state_is long running || fail "long never ran: $(R HGETALL qjob:long | tr '\n' ' ')"

echo "== a job submitted now waits on the queue, visible"
[ "$(post waits small)" = 202 ] || fail "POST waits: $(cat "$T/post.out")"
grep -q '"state":"queued"' "$T/post.out" || fail "POST answer: $(cat "$T/post.out")"
state_is waits queued || fail "GET waits: $(curl -s "$U/v1/jobs/waits")"
curl -s "$U/v1/jobs?state=queued" | grep -q '"id":"waits"' || fail "?state=queued lacks waits: $(curl -s "$U/v1/jobs?state=queued")"
[ "$(R LLEN qjobs)" = 1 ] || fail "queue length $(R LLEN qjobs)"

echo "== a queued job cancelled leaves the queue at once"
[ "$(post gone small)" = 202 ] || fail "POST gone"
code=$(curl -s -o "$T/del.out" -w '%{http_code}' -X DELETE -H "$A" "$U/v1/jobs/gone")
[ "$code" = 200 ] && grep -q '"state":"cancelled"' "$T/del.out" || fail "DELETE gone: $code $(cat "$T/del.out")"
state_is gone cancelled || fail "gone: $(curl -s "$U/v1/jobs/gone")"
[ "$(R LLEN qjobs)" = 1 ] || fail "queue length after the cancel $(R LLEN qjobs)"

echo "== the queued job runs once the worker is free; the cancelled one never does"
wait_for 300 state_is long done || fail "long: $(R HGETALL qjob:long | tr '\n' ' ')"
wait_for 60 state_is waits done || fail "waits: $(R HGETALL qjob:waits | tr '\n' ' ')"
[ -s "$T/out-waits/quantd_report.json" ] || fail "waits has no report"
[ -e "$T/out-gone" ] && fail "the cancelled job wrote an output"
state_is gone cancelled || fail "gone changed: $(curl -s "$U/v1/jobs/gone")"
[ "$(R LLEN qjobs:failed)" = 0 ] || fail "failed payloads: $(R LRANGE qjobs:failed 0 -1)"

echo "== resubmitted, the cancelled and the done job run again"
[ "$(post gone small)" = 202 ] || fail "POST gone again: $(cat "$T/post.out")"
wait_for 60 state_is gone done || fail "gone resubmitted: $(R HGETALL qjob:gone | tr '\n' ' ')"
[ "$(post waits small)" = 202 ] || fail "POST waits again: $(cat "$T/post.out")"
wait_for 60 state_is waits done || fail "waits resubmitted: $(R HGETALL qjob:waits | tr '\n' ' ')"
[ "$(grep -c 'job_final job=waits state=done' "$T/d.log")" = 2 ] || fail "waits did not run twice"
[ "$(grep -c 'job_final job=gone state=done' "$T/d.log")" = 1 ] || fail "gone did not run once"
grep -q 'job_final job=gone state=cancelled' "$T/d.log" && fail "the daemon saw gone's cancel (it never held it)"
[ "$(R LLEN qjobs:failed)" = 0 ] || fail "failed payloads: $(R LRANGE qjobs:failed 0 -1)"

kill -TERM "$DPID"; wait "$DPID"; DPID=
echo "test_http_queue: ok"
