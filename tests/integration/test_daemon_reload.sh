#!/usr/bin/env bash
# SIGHUP through the HTTP API (issue #15, defect 4), against a real redis-server and quantd
# with a config file: rotating http-token takes effect at once (the old token is refused,
# the new one accepted), http-cors and max-job-bytes follow, options that need a restart
# (queue, heartbeat) are logged as reload_needs_restart and keep their running value (jobs
# are still taken from the old queue), the configuration generation goes 1 -> 2 in /healthz,
# /readyz and /metrics and in the config_reloaded log line, a broken file is refused and
# keeps generation and token, and the token never reaches the log.
set -u
DC_NAME=qdd-hup
. "$(dirname "$0")/daemon_common.sh"
U="http://127.0.0.1:$HP"
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
RP=$!
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.05; done
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }   # HTTP status only
state_is() { [ "$(R HGET "qjob:$1" state)" = "$2" ]; }
ready() { [ "$(code "$U/readyz")" = 200 ]; }

write_conf() {   # token cors max_job_bytes queue heartbeat
    cat >"$T/quantd.conf" <<EOF
redis = redis://127.0.0.1:$PORT
node = hup
workers = cpu:1
allow-root = $T
http = 127.0.0.1:$HP
http-token = $1
http-cors = $2
max-job-bytes = $3
queue = $4
heartbeat = $5
EOF
}

"$B/quantctl" gen-model --out "$T/model" --layers 4 --hidden 128 >/dev/null || fail "gen-model"
write_conf old-token-1 http://a.example 65536 qjobs 1
"$B/quantd" --config "$T/quantd.conf" >"$T/d.log" 2>&1 &
DPID=$!
wait_for 20 ready || fail "quantd not ready"
curl -s "$U/healthz" | grep -q '"config_generation":1' || fail "healthz generation 1"
grep -q "INFO config generation=1 " "$T/d.log" || fail "start-up config line without generation=1"
[ "$(code -X DELETE -H 'Authorization: Bearer old-token-1' "$U/v1/jobs/nope")" = 404 ] || fail "old token refused before the reload"
[ "$(code -X DELETE -H 'Authorization: Bearer new-token-2' "$U/v1/jobs/nope")" = 401 ] || fail "new token accepted before the reload"

echo "== rotate the token (and CORS, body limit, two restart-only options); SIGHUP"
write_conf new-token-2 http://b.example 2000 otherq 5
kill -HUP "$DPID"
wait_for 10 grep -q "config_reloaded generation=2 " "$T/d.log" || fail "no config_reloaded generation=2"
[ "$(code -X DELETE -H 'Authorization: Bearer old-token-1' "$U/v1/jobs/nope")" = 401 ] || fail "old token still accepted after SIGHUP"
[ "$(code -X DELETE -H 'Authorization: Bearer new-token-2' "$U/v1/jobs/nope")" = 404 ] || fail "new token refused after SIGHUP"
curl -s -D - -o /dev/null -H 'Origin: http://b.example' "$U/healthz" | grep -qi '^Access-Control-Allow-Origin: http://b.example' ||
    fail "new CORS origin not allowed"
curl -s -D - -o /dev/null -H 'Origin: http://a.example' "$U/healthz" | grep -qi '^Access-Control-Allow-Origin' &&
    fail "old CORS origin still allowed"
big=$(python3 -c "print('{\"model\":\"$T/model\",\"output\":\"$T/o\",\"method\":\"rtn\",\"pad\":\"' + 'x' * 3000 + '\"}')")
[ "$(code -X POST -H 'Authorization: Bearer new-token-2' --data "$big" "$U/v1/jobs")" = 413 ] || fail "new body limit not applied"
curl -s "$U/healthz" | grep -q '"config_generation":2' || fail "healthz generation 2"
curl -s "$U/readyz" | grep -q '"config_generation":2' || fail "readyz generation 2"
curl -s "$U/metrics" | grep -q '^quantd_config_generation 2$' || fail "metrics generation 2"
grep -q "reload_needs_restart option=queue running=qjobs new=otherq" "$T/d.log" || fail "queue not reported as needing a restart"
grep -q "reload_needs_restart option=heartbeat running=1 new=5" "$T/d.log" || fail "heartbeat not reported as needing a restart"
grep -q "token-1\|token-2" "$T/d.log" && fail "a token reached the log"
# The queue kept its running value: a job pushed on qjobs is still taken.
R LPUSH qjobs "{\"id\":\"h1\",\"model\":\"$T/model\",\"output\":\"$T/h1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"}" >/dev/null
wait_for 30 state_is h1 done || fail "job on the running queue not taken after the reload: $(R HGETALL qjob:h1 | tr '\n' ' ')"

echo "== a broken file is refused: generation and token stay"
echo "no-such-option = 1" >>"$T/quantd.conf"
kill -HUP "$DPID"
wait_for 10 grep -q "reload_failed" "$T/d.log" || fail "broken config not refused"
curl -s "$U/healthz" | grep -q '"config_generation":2' || fail "generation moved on a failed reload"
[ "$(code -X DELETE -H 'Authorization: Bearer new-token-2' "$U/v1/jobs/nope")" = 404 ] || fail "token lost on a failed reload"

echo "== several reloads in a row (replaced configurations are freed; ASan reports leaks at exit)"
for g in 3 4 5; do
    write_conf token-$g http://b.example 2000 qjobs 1
    kill -HUP "$DPID"
    wait_for 10 grep -q "config_reloaded generation=$g " "$T/d.log" || fail "no config_reloaded generation=$g"
done
[ "$(code -X DELETE -H 'Authorization: Bearer token-5' "$U/v1/jobs/nope")" = 404 ] || fail "latest token refused"
[ "$(code -X DELETE -H 'Authorization: Bearer token-4' "$U/v1/jobs/nope")" = 401 ] || fail "previous token accepted"
curl -s "$U/metrics" | grep -q '^quantd_config_generation 5$' || fail "metrics generation 5"
kill -TERM "$DPID"; wait "$DPID"; rc=$?; DPID=
[ $rc = 0 ] || fail "quantd exited $rc on SIGTERM"
grep -q "ERROR: LeakSanitizer\|ERROR: AddressSanitizer" "$T/d.log" && fail "sanitizer report"
echo "PASS"
