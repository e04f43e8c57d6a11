#!/usr/bin/env bash
# quantd across Redis going away and coming back, against a real redis-server on a random
# loopback port (issue #15, defects 2 and 8):
#   - quantd starts before redis-server exists: its connects are refused and retried with
#     backoff, and once redis-server starts it connects (readyz 200) with exactly 3 Redis
#     connections (cmd, pop, sub; the HTTP API shares them);
#   - four restarts mid-job: SHUTDOWN NOSAVE and kill -9, each with Redis coming back with its
#     data (append-only file, fsync always) and coming back empty. Each time every
#     connection reconnects, readyz is 200 again, the running job finishes `done` in its
#     status hash (spec and index entry there too), its processing-list entry and lease are
#     gone, progress events flow again after the reconnect, and a job pushed afterwards is
#     taken. An empty Redis is logged as redis_data_lost naming what was re-created.
set -u
DC_NAME=qdd-rr
DC_LOG_FILTER="layer_done\|progress stage\|redis_connect_failed"
DC_LOG_LINES=60
. "$(dirname "$0")/daemon_common.sh"
mkdir -p "$T/rdata"
start_redis() {
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
        --dir "$T/rdata" >>"$T/redis.log" 2>&1 &
    RP=$!
    for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && return 0; sleep 0.05; done
    fail "redis-server did not start"
}
state_is() { [ "$(R HGET "qjob:$1" state 2>/dev/null)" = "$2" ]; }
block_ge() { local b; b=$(sed -n 's/.*"next_block"[^0-9]*\([0-9]*\).*/\1/p' "$T/$1/.quantd/state.json" 2>/dev/null); [ -n "$b" ] && [ "$b" -ge "$2" ]; }
job() { echo "{\"id\":\"$1\",\"model\":\"$T/$2\",\"output\":\"$T/$1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"}"; }
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HP/readyz")" = 200 ]; }
conns() { R CLIENT LIST | grep -c 'name=quantd:rr:'; }
count() { grep -c "$1" "$T/d.log"; }

# 32 blocks take seconds on one CPU worker: long enough to span an outage of about 1 s.
"$B/quantctl" gen-model --out "$T/big" --layers 32 --hidden 256 >/dev/null || fail "gen-model"
"$B/quantctl" gen-model --out "$T/small" --layers 4 --hidden 128 >/dev/null || fail "gen-model"

echo "== quantd starts before redis-server exists"
"$B/quantd" --redis "redis://127.0.0.1:$PORT" --node rr --allow-root "$T" --workers cpu:1 --heartbeat 1 \
    --node-ttl-ms 2000 --lease-ttl-ms 3000 --http "127.0.0.1:$HP" >"$T/d.log" 2>&1 &
DPID=$!
wait_for 10 sh -c "[ \$(grep -c 'redis_connect_failed conn=cmd' $T/d.log) -ge 3 ]" || fail "connect refusals not retried"
ready && fail "readyz 200 without Redis"
start_redis
wait_for 15 ready || fail "no reconnect once redis-server started"
for c in cmd pop sub; do grep -q "redis_up conn=$c " "$T/d.log" || fail "conn $c never up"; done
wait_for 5 sh -c "[ \$(redis-cli -p $PORT CLIENT LIST | grep -c 'name=quantd:rr:') = 3 ]" || fail "$(conns) Redis connections, not 3"

n=0
for mode in shutdown kill9; do
    for data in keep empty; do
        n=$((n + 1)); id="r$n"
        echo "== Redis stopped ($mode), back $( [ $data = keep ] && echo with its data || echo empty ), job $id running"
        R LPUSH qjobs "$(job $id big)" >/dev/null
        wait_for 30 block_ge $id 2 || fail "$id did not start: $(R HGETALL qjob:$id | tr '\n' ' ')"
        state_is $id running || fail "$id not running"
        downs=$(count "redis_down conn="); ups=$(count "redis_up conn=")
        if [ $mode = shutdown ]; then R SHUTDOWN NOSAVE >/dev/null 2>&1; else kill -9 "$RP"; fi
        wait "$RP" 2>/dev/null
        wait_for 5 sh -c "[ \$(grep -c 'redis_down conn=' $T/d.log) -ge $((downs + 3)) ]" || fail "the daemon did not see Redis go"
        sleep 0.5
        [ $data = empty ] && rm -rf "$T/rdata"/*
        start_redis
        wait_for 15 ready || fail "readyz not 200 after the restart ($mode, $data)"
        wait_for 10 sh -c "[ \$(grep -c 'redis_up conn=' $T/d.log) -ge $((ups + 3)) ]" || fail "not every connection reconnected"
        wait_for 5 sh -c "[ \$(redis-cli -p $PORT CLIENT LIST | grep -c 'name=quantd:rr:') = 3 ]" || fail "$(conns) Redis connections, not 3"
        if [ $data = empty ]; then
            # The job was re-registered at once (the worker keeps running meanwhile).
            wait_for 5 sh -c "redis-cli -p $PORT HGET qjob:$id spec | grep -q '\"id\":\"$id\"'" || fail "$id spec not re-created"
            grep -q "redis_data_lost job=$id recreated=.*processing.*status.*index" "$T/d.log" || fail "no redis_data_lost for $id"
        else
            grep -q "redis_data_lost job=$id" "$T/d.log" && fail "redis_data_lost logged although Redis kept its data"
        fi
        wait_for 60 state_is $id done || fail "$id did not finish after the restart: $(R HGETALL qjob:$id | tr '\n' ' ')"
        [ -s "$T/$id/quantd_report.json" ] || fail "$id has no report"
        R HGET qjob:$id spec | grep -q "\"id\":\"$id\"" || fail "$id status hash has no spec"
        [ -n "$(R ZSCORE qjobs:index $id)" ] || fail "$id not in the index"
        [ "$(R LLEN qjobs:processing:rr)" = 0 ] || fail "processing list not empty: $(R LRANGE qjobs:processing:rr 0 -1)"
        [ "$(R EXISTS qjob:$id:lease)" = 0 ] || fail "$id lease left behind"
        # Progress publishing went on after the reconnect: the stream (re-created when Redis
        # came back empty) holds progress of the running job and its final state.
        R XRANGE qjob:$id:events - + | grep -q '"state":"running"' || fail "no running events in the stream after the reconnect"
        R XRANGE qjob:$id:events - + | grep -q '"state":"done"' || fail "no done event in the stream"
        curl -sf "http://127.0.0.1:$HP/v1/jobs/$id" | grep -q '"state":"done"' || fail "HTTP API does not see $id done"
    done
done

echo "== a job pushed after the restarts is taken"
R LPUSH qjobs "$(job after small)" >/dev/null
wait_for 30 state_is after done || fail "job pushed after the restarts not taken: $(R HGETALL qjob:after | tr '\n' ' ')"
kill -TERM "$DPID"; wait "$DPID"; rc=$?; DPID=
[ $rc = 0 ] || fail "quantd exited $rc on SIGTERM"
echo "PASS"
