#!/usr/bin/env bash
# One daemon per --node (issue #33, item 10), against a real redis-server on a random
# loopback port:
#   - daemon A runs as node X; daemon B started as node X too refuses to start: it exits with
#     a non-zero status and says why in its log (node_in_use ... refusing to start), and A
#     keeps its key (its token) and stays ready;
#   - A stopped cleanly (SIGTERM) releases its key at once: B then starts without waiting;
#   - B killed with -9 leaves its key behind: C started as node X waits for the key to
#     expire (node-ttl-ms), takes the node over (node_taken_over), hands back the job B
#     left in the processing list, and runs it to done.
set -u
DC_NAME=qdd-nu
. "$(dirname "$0")/daemon_common.sh"

redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
RP=$!
wait_for 5 sh -c "redis-cli -p $PORT PING >/dev/null 2>&1" || fail "redis-server did not start"
"$B/quantctl" gen-model --out "$T/small" --layers 2 --hidden 64 >/dev/null || fail "gen-model"

OTHER=
trap 'cleanup; [ -n "$OTHER" ] && kill -9 $OTHER 2>/dev/null' EXIT
state_is() { [ "$(R HGET "qjob:$1" state 2>/dev/null)" = "$2" ]; }
job() { echo "{\"id\":\"$1\",\"model\":\"$T/small\",\"output\":\"$T/$1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"}"; }
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HP/readyz")" = 200 ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }
# quantd NAME [args]: node X, its log in $T/NAME.log, its pid in QPID.
quantd() {
    local name=$1; shift
    "$B/quantd" --redis "redis://127.0.0.1:$PORT" --node X --allow-root "$T" --workers cpu:1 --heartbeat 1 \
        --node-ttl-ms 1500 --lease-ttl-ms 3000 "$@" >"$T/$name.log" 2>&1 &
    QPID=$!
}

echo "== A runs as node X; B, started as node X too, refuses"
quantd a --http "127.0.0.1:$HP"
DPID=$QPID
ln -sf "$T/a.log" "$T/d.log"
wait_for 30 ready || fail "A not ready"
token=$(R GET qjobs:node:X)
case "$token" in *:"$DPID":*) ;; *) fail "node key '$token' does not name A (pid $DPID)" ;; esac
[ "$(R PTTL qjobs:node:X)" -gt 0 ] || fail "the node key has no TTL"
quantd b
OTHER=$QPID
wait_for 30 gone "$OTHER" || fail "B still running as node X: $(tail -5 "$T/b.log")"
wait "$OTHER"; rc=$?; OTHER=
[ $rc = 3 ] || fail "B exited $rc, not 3 (QDD_EXIT_NODE_IN_USE)"
grep -q "ERROR node_in_use node=X .*refusing to start" "$T/b.log" || fail "B did not say why: $(grep node_ "$T/b.log")"
grep -q "job_start\|node_claimed\|node_taken_over" "$T/b.log" && fail "B claimed the node or ran a job"
[ "$(R GET qjobs:node:X)" = "$token" ] || fail "B changed A's node key"
ready || fail "A not ready after B refused"
grep -q "node_lost" "$T/a.log" && fail "A lost its node to B"
R LPUSH qjobs "$(job a1)" >/dev/null
wait_for 60 state_is a1 done || fail "A did not run a1: $(R HGETALL qjob:a1 | tr '\n' ' ')"

echo "== A stopped cleanly releases the node: B starts at once"
kill -TERM "$DPID"; wait "$DPID"; rc=$?; DPID=
[ $rc = 0 ] || fail "A exited $rc on SIGTERM"
[ "$(R EXISTS qjobs:node:X)" = 0 ] || fail "A's node key left behind: $(R GET qjobs:node:X)"
grep -q "node_released node=X" "$T/a.log" || fail "A did not log the release"
quantd b2 --http "127.0.0.1:$HP"
DPID=$QPID
ln -sf "$T/b2.log" "$T/d.log"
wait_for 30 ready || fail "B not ready after A released the node"
grep -q "node_claimed node=X" "$T/b2.log" || fail "B did not claim the node"
grep -q "node_in_use" "$T/b2.log" && fail "B waited for a released key"

echo "== B killed with -9: C waits for its key to expire, takes over, runs B's job"
"$B/quantctl" gen-model --out "$T/big" --layers 24 --hidden 256 >/dev/null || fail "gen-model big"
R LPUSH qjobs "{\"id\":\"k1\",\"model\":\"$T/big\",\"output\":\"$T/k1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"}" >/dev/null
wait_for 30 state_is k1 running || fail "k1 did not start on B"
W=$(pgrep -P "$DPID" quantd-worker | head -1)
kill -9 "$DPID"; [ -n "$W" ] && kill -9 "$W" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=
[ "$(R LLEN qjobs:processing:X)" = 1 ] || fail "k1 not in B's processing list when B died"
[ "$(R EXISTS qjobs:node:X)" = 1 ] || fail "B's key vanished at once (it should expire)"
quantd c --http "127.0.0.1:$HP"
DPID=$QPID
ln -sf "$T/c.log" "$T/d.log"
wait_for 30 ready || fail "C not ready after B's key expired"
grep -q "WARN node_in_use node=X .*waiting" "$T/c.log" || fail "C did not wait for B's key"
grep -q "node_taken_over node=X" "$T/c.log" || fail "C did not take the node over"
grep -q "jobs_reclaimed count=1" "$T/c.log" || fail "C did not hand back the job B left"
wait_for 120 state_is k1 done || fail "k1 not done after the takeover: $(R HGETALL qjob:k1 | tr '\n' ' ')"
kill -TERM "$DPID"; wait "$DPID"; rc=$?; DPID=
[ $rc = 0 ] || fail "C exited $rc on SIGTERM"
for f in a b b2 c; do
    grep -q "ERROR: LeakSanitizer\|ERROR: AddressSanitizer\|runtime error:" "$T/$f.log" && fail "sanitizer report in $f.log"
done
echo "PASS"
