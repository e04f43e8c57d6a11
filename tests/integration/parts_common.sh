# Sourced by the tests of parts (test_daemon_parts.sh, test_daemon_nodes_parts.sh) after
# daemon_common.sh: a redis-server on $PORT ($RP), one thread per quantd process (several
# workers and daemons share a small machine), state_is ID STATE and final ID (the job's
# state), same_bytes REF DIR (two outputs compared), and $T/calib.json, pre-tokenized calibration ids (the generated models have no
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
# same_bytes REF DIR: every file of both trees byte-identical (cmp), the report compared
# without its run-dependent fields (ids, paths, timings, resources: the estimate and the
# measured peaks, which count the part files a fan-out writes; which worker ran a part).
same_bytes() {
    (cd "$1" && find . -type f | sort) >"$T/ref.files"
    (cd "$2" && find . -type f | sort) >"$T/got.files"
    cmp -s "$T/ref.files" "$T/got.files" || { diff "$T/ref.files" "$T/got.files" >&2; return 1; }
    local f
    while read -r f; do
        [ "$(basename "$f")" = quantd_report.json ] && continue
        cmp "$1/$f" "$2/$f" >&2 || return 1
    done <"$T/ref.files"
    python3 - "$1/quantd_report.json" "$2/quantd_report.json" <<'PY'
import json, sys
def norm(o):
    if isinstance(o, dict):
        return {k: norm(v) for k, v in o.items()
                if k not in ("job_id", "id", "output", "stages", "resources", "worker", "workers", "parts")
                and "seconds" not in k and not k.endswith("_ms")}
    if isinstance(o, list):
        return [norm(v) for v in o]
    return o
a, b = (norm(json.load(open(p))) for p in sys.argv[1:3])
if a != b:
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            print("report differs at", k, file=sys.stderr)
    sys.exit(1)
PY
}
