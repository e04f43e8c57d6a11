# Sourced by the tests of parts (test_daemon_parts.sh, test_daemon_nodes_parts.sh) after
# daemon_common.sh: a redis-server on $PORT ($RP), one thread per quantd process (several
# workers and daemons share a small machine), state_is ID STATE and final ID (the job's
# state), and $T/calib.json, pre-tokenized calibration ids (the generated models have no
# tokenizer).
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
RP=$!
for _ in $(seq 100); do R PING >/dev/null 2>&1 && break; sleep 0.05; done
export QUANTD_THREADS=1
state_is() { [ "$(R HGET "qjob:$1" state)" = "$2" ]; }
final() { local s; s=$(R HGET "qjob:$1" state); [ "$s" = done ] || [ "$s" = failed ] || [ "$s" = cancelled ]; }
python3 - "$T/calib.json" <<'PY' || fail "calibration ids"
import json, random, sys
r = random.Random(1)
json.dump([r.randrange(3, 128) for _ in range(4096)], open(sys.argv[1], "w"))
PY
