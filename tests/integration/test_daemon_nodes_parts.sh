#!/usr/bin/env bash
# Parts over several nodes (daemon/parts_nodes.c; proto/redis.md, "Parts over several nodes";
# docs/parallel.md): one redis-server, two daemons on one machine with different --node names
# and one shared directory ($T) as their allow-root, standing in for a filesystem every node
# mounts. n1 (two CPU workers) holds the jobs; n2 (two CPU workers, --remote-parts 1) takes
# parts of them:
#   - a GPTQ job on a model whose gate/up projections are cut into two row ranges each ends
#     with the bytes of a one-worker run, and n2's workers ran parts of it (n2's
#     remote_part_done lines, n1's part_done lines naming n2/cpu-N);
#   - with both of n2's workers frozen (SIGSTOP) n2 claims a part it cannot finish, the job's
#     status lists it as n2/cpu-N; then kill -9 of n2 and its workers: the claim lapses, n1
#     puts the part back (part_requeued ... node=n2), and the job still ends with the same
#     bytes;
#   - the passes over the block and the factorisations go over nodes too: with n1 down to one
#     worker (the lead), a dense job without true-sequential, in three calibration shards of a
#     forward batch each, sends its capture parts and its factor parts to n2, and ends with
#     the bytes of a one-worker run.
# Nothing here asserts a duration: every wait is a bounded poll.
set -u
DC_NAME=qdd-nparts
. "$(dirname "$0")/daemon_common.sh"
N2PID=; N2W=
cleanup_nodes() { [ -n "$N2W" ] && kill -9 $N2W 2>/dev/null; [ -n "$N2PID" ] && kill -9 "$N2PID" 2>/dev/null; cleanup; }
trap cleanup_nodes EXIT
nfail() { echo "--- n2's log:" >&2; tail -30 "$T/n2.log" >&2; fail "$@"; }
. "$(dirname "$0")/parts_common.sh"

# gate/up of 2112 rows: two row ranges each, so their step has 4 parts.
"$B/quantctl" gen-model --out "$T/m" --layers 4 --hidden 512 --intermediate 2112 >/dev/null || fail "gen-model"
job() {
    echo "{\"id\":\"$1\",\"model\":\"$T/m\",\"output\":\"$T/out/$1\",\"method\":\"gptq\",\"group_size\":32,\"backend\":\"cpu\",\"calibration\":{\"path\":\"$T/calib.json\",\"samples\":8,\"seq_len\":64}${2:-}}"
}
job ref ',"workers":1' >"$T/ref.json"
"$B/quantctl" quantize "$T/ref.json" >"$T/ref.log" 2>&1 || fail "the reference run"

common=(--redis "redis://127.0.0.1:$PORT" --allow-root "$T" --heartbeat 1 --node-ttl-ms 2000 --lease-ttl-ms 3000)
start_n1() {
    "$B/quantd" "${common[@]}" --node n1 --workers cpu:2 >>"$T/d.log" 2>&1 &
    DPID=$!
}
start_n2() {
    echo "=== n2" >>"$T/n2.log"
    "$B/quantd" "${common[@]}" --node n2 --workers cpu:2 --remote-parts 1 >>"$T/n2.log" 2>&1 &
    N2PID=$!
}
# n2's lines since its last start
n2_now() { awk '/^=== n2/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' "$T/n2.log"; }
n2_ready() { [ "$(n2_now | grep -c worker_ready)" -ge 2 ]; }
stop_n2() {
    kill -TERM "$N2PID"
    wait_for 60 sh -c "! kill -0 $N2PID 2>/dev/null" || nfail "n2 did not stop on SIGTERM"
    wait "$N2PID" 2>/dev/null
    N2PID=
}
# on_n1 ID: the job runs on n1 (n2 starts only then, so that it does not take the job itself)
on_n1() { state_is "$1" running && [ "$(R HGET "qjob:$1" node)" = n1 ]; }
# push_with_n2 ID: pushes $T/ID.json; once it runs on n1, starts n2; waits for it to end done
push_with_n2() {
    R LPUSH qjobs "$(cat "$T/$1.json")" >/dev/null
    wait_for 120 on_n1 "$1" || fail "$1 did not start on n1"
    start_n2
    wait_for 120 n2_ready || nfail "n2's workers did not start for $1"
    wait_for 600 final "$1" || nfail "$1 did not end: $(R HGETALL "qjob:$1" | tr '\n' ' ')"
    state_is "$1" done || nfail "$1 ended $(R HGET "qjob:$1" state): $(R HGET "qjob:$1" error)"
}

echo "== n2 takes parts of n1's job"
start_n1
wait_for 120 sh -c "[ \"\$(grep -c worker_ready $T/d.log)\" -ge 2 ] && grep -q worker_ready '$T/d.log'" || fail "n1's worker did not start"
job a >"$T/a.json"
push_with_n2 a
grep -q "parts_open job=a .* shared=1" "$T/d.log" || nfail "n1 never shared a fan-out of a"
grep -q "remote_part_done job=a node=n1 .* ok=1" "$T/n2.log" || nfail "n2 ran no part of a"
grep -q "part_done job=a .* worker=n2/cpu-[01] lead=0" "$T/d.log" || nfail "n1 saw no part of a done on n2"
[ -z "$(R HGET qjob:a parts)" ] || nfail "parts left in a's status: $(R HGET qjob:a parts)"
wait_for 30 sh -c "[ \"\$(redis-cli -p $PORT EXISTS qjob:a:fanout)\" = 0 ] && [ \"\$(redis-cli -p $PORT SCARD qjobs:fanouts)\" = 0 ]" ||
    nfail "a's fan-out left in Redis"
same_bytes "$T/out/ref" "$T/out/a" || nfail "a's output differs from one worker's"

echo "== kill -9 n2 while it holds a part: the part is requeued, the bytes the same"
stop_n2
job b >"$T/b.json"
R LPUSH qjobs "$(cat "$T/b.json")" >/dev/null
wait_for 120 on_n1 b || fail "b did not start on n1"
start_n2
wait_for 120 n2_ready || nfail "n2's workers did not start again"
N2W=$(n2_now | sed -n 's/.*worker_spawn worker=cpu-[01] pid=\([0-9]*\).*/\1/p' | tr '\n' ' ')
[ "$(echo $N2W | wc -w)" = 2 ] || nfail "no pids for n2's workers: $N2W"
kill -STOP $N2W
# A part claimed from now on is handed to a frozen worker and cannot finish.
before=$(n2_now | grep -c "remote_part_start job=b ")
held() { [ "$(n2_now | grep -c "remote_part_start job=b ")" -gt "$before" ]; }
wait_for 300 held || { kill -CONT $N2W; nfail "n2 claimed no part of b with its workers frozen"; }
listed() { R HGET qjob:b parts | grep -q '"worker":"n2/cpu-[01]"'; }
wait_for 60 listed || { kill -CONT $N2W; nfail "b's status never listed n2's part: $(R HGET qjob:b parts)"; }
kill -9 "$N2PID" $N2W
wait "$N2PID" 2>/dev/null
N2PID=; N2W=
wait_for 600 final b || fail "b did not end after n2's kill"
state_is b done || fail "b ended $(R HGET qjob:b state): $(R HGET qjob:b error)"
grep -q "part_requeued job=b .* node=n2 " "$T/d.log" || fail "n2's part of b was not requeued"
[ "$(R HGET qjob:b attempts)" = 1 ] || fail "n2's death restarted b: attempts $(R HGET qjob:b attempts)"
same_bytes "$T/out/ref" "$T/out/b" || fail "b's output differs after n2's kill"
stop_n1() {
    kill -TERM "$DPID"
    wait_for 60 sh -c "! kill -0 $DPID 2>/dev/null" || fail "n1 did not stop on SIGTERM"
    wait "$DPID" 2>/dev/null
    DPID=
}

echo "== capture and factor parts on n2"
# 3 x 4096 tokens: three forward batches, a shard each. Without true-sequential one fan-out
# quantizes every group of a block, so its factorisations go out first (step factor); the
# float pass and the last forward go out as capture parts (step capture). n1 keeps one
# worker, the lead: every part that leaves it runs on n2.
stop_n1
"$B/quantctl" gen-model --out "$T/long" --layers 4 --hidden 128 --max-pos 1024 >/dev/null || fail "gen-model long"
python3 -c 'import json, random, sys; r = random.Random(3); json.dump([r.randrange(3, 128) for _ in range(12288)], open(sys.argv[1], "w"))' \
    "$T/calib-long.json" || fail "calibration ids"
long_job() {
    echo "{\"id\":\"$1\",\"model\":\"$T/long\",\"output\":\"$T/out/$1\",\"method\":\"gptq\",\"group_size\":32,\"backend\":\"cpu\",\"true_sequential\":false,\"calibration\":{\"path\":\"$T/calib-long.json\",\"samples\":12,\"seq_len\":1024,\"shards\":3}${2:-}}"
}
long_job cref ',"workers":1' >"$T/cref.json"
"$B/quantctl" quantize "$T/cref.json" >"$T/cref.log" 2>&1 || fail "the reference run of c"
: >"$T/d.log.c"
"$B/quantd" "${common[@]}" --node n1 --workers cpu:1 >>"$T/d.log.c" 2>&1 &
DPID=$!
wait_for 120 grep -q worker_ready "$T/d.log.c" || fail "n1's worker did not start again"
long_job c >"$T/c.json"
push_with_n2 c
cat "$T/d.log.c" >>"$T/d.log"
for step in capture factor; do
    n2_now | grep -q "remote_part_done job=c node=n1 block=[0-9]* step=$step .* ok=1" ||
        nfail "n2 ran no $step part of c"
done
grep -q "part_recomputed job=c" "$T/d.log.c" && nfail "n1 computed again a part of c that n2 made"
same_bytes "$T/out/cref" "$T/out/c" || nfail "c's output differs from one worker's"
stop_n2
stop_n1
grep -q "Sanitizer\|runtime error:" "$T/d.log" "$T/n2.log" && fail "a sanitizer report in a log"
echo "PASS"
