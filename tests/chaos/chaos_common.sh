# Sourced by tests/chaos/test_*.sh: the shared preamble of the chaos tests (issue #15).
#
# Each script runs several independent cases with run_case; a case runs in a subshell with
# its own redis-server (random loopback port, data in its own temp dir) and its own quantd,
# and a failing case ("fail MSG": prints the message and the tail of its logs, then leaves
# the subshell) does not stop the cases after it. Every process a case starts is written to
# $T/pids and killed, by pid, when the case ends and again when the script exits; tmpfs
# mounts made by a case are written to $T/mounts and unmounted likewise. Every wait is
# bounded (wait_for SECS). The script exits 1 when any case failed, 77 when every case was
# skipped (no redis-server, binaries not built), 0 otherwise, and prints one line per case
# with its outcome and seconds.
set -u
B="${QUANTD_BUILD_DIR:-}"
for x in quantd quantd-worker quantctl; do
    [ -n "$B" ] && [ -x "$B/$x" ] || { echo "SKIP: $B/$x not built (QUANTD_BUILD_DIR=${B:-unset})"; exit 77; }
done
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { echo "SKIP: no redis-server/redis-cli"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 needed to compare outputs and reports"; exit 77; }
command -v sha256sum >/dev/null || { echo "SKIP: sha256sum needed"; exit 77; }

T=$(mktemp -d /tmp/qd-chaos-XXXXXX)
: >"$T/pids"
: >"$T/mounts"
: >"$T/results"

# Kills every process a case or the script started (workers first, by their parent's pid),
# unmounts what was mounted, and removes the temp dir.
kill_started() {
    local p
    while read -r p; do
        [ -n "$p" ] || continue
        for w in $(pgrep -P "$p" 2>/dev/null); do kill -9 "$w" 2>/dev/null; done
        kill -9 "$p" 2>/dev/null
    done <"$T/pids"
    : >"$T/pids"
}
unmount_made() {
    local m
    while read -r m; do [ -n "$m" ] && umount -l "$m" 2>/dev/null; done <"$T/mounts"
    : >"$T/mounts"
}
chaos_exit() {
    kill_started
    unmount_made
    rm -rf "$T"
}
trap chaos_exit EXIT

now() { date +%s%N | cut -c1-13; }
track() { echo "$1" >>"$T/pids"; }

# ---- cases ------------------------------------------------------------------------------------

CASE=""
C=""          # the case's own directory
# run_case NAME FUNCTION: runs FUNCTION in a subshell with $C = $T/NAME; exit 77 = skipped.
run_case() {
    local name=$1 fn=$2 t0 rc secs
    t0=$(now)
    echo "== $name"
    (
        CASE=$name
        C="$T/$name"
        mkdir -p "$C"
        "$fn"
    )
    rc=$?
    kill_started
    unmount_made
    secs=$(( ($(now) - t0) / 1000 ))
    case $rc in
        0) echo "PASS $name (${secs}s)" | tee -a "$T/results" ;;
        77) echo "SKIP $name (${secs}s)" | tee -a "$T/results" ;;
        *) echo "FAIL $name (${secs}s)" | tee -a "$T/results" ;;
    esac
}
# finish: the summary and the script's exit status.
finish() {
    echo "== summary"
    cat "$T/results"
    grep -q '^FAIL' "$T/results" && exit 1
    grep -q '^PASS' "$T/results" || exit 77
    exit 0
}
dump_logs() {
    local f
    for f in "$C"/*.log; do
        [ -f "$f" ] || continue
        echo "== $f"
        grep -v "layer_done\|progress stage" "$f" | tail -30
    done >&2
}
fail() {
    echo "FAIL [$CASE]: $*" >&2
    dump_logs
    exit 1
}
skip() { echo "SKIP [$CASE]: $*"; exit 77; }
note() { echo "   $*"; }

# wait_for SECS CMD...: polls CMD until it succeeds (0) or SECS pass (1).
wait_for() {
    local s=$1; shift
    local end=$(( $(now) + s * 1000 ))
    while [ "$(now)" -lt $end ]; do "$@" && return 0; sleep 0.05; done
    return 1
}
# alive PID: the process exists and is not a zombie.
alive() { [ -e "/proc/$1" ] && ! awk '{ exit !($3 == "Z") }' "/proc/$1/stat" 2>/dev/null; }
dead() { ! alive "$1"; }

# ---- redis ------------------------------------------------------------------------------------

# start_redis [none|rdb|aof]: a redis-server on a random loopback port (kept in $PORT across
# restarts of the same case) with its data in $C/redis. none = no persistence; rdb = only
# what SAVE / SHUTDOWN SAVE write; aof = append-only file, fsync always (survives kill -9).
# Sets $RP.
start_redis() {
    local mode=${1:-none} args
    mkdir -p "$C/redis"
    case $mode in
        none) args=(--save '' --appendonly no) ;;
        rdb) args=(--save '' --appendonly no --dbfilename dump.rdb) ;;
        aof) args=(--save '' --appendonly yes --appendfsync always) ;;
    esac
    # A restart keeps the case's port (the daemon's URL names it); a first start picks one.
    local tries fixed=${PORT:+1}
    for tries in 1 2 3 4 5; do
        [ -n "${PORT:-}" ] || PORT=$((20000 + RANDOM % 30000))
        redis-server --port "$PORT" --bind 127.0.0.1 --dir "$C/redis" "${args[@]}" >>"$C/redis.log" 2>&1 &
        RP=$!
        track "$RP"
        if wait_for 5 sh -c "redis-cli -p $PORT PING 2>/dev/null | grep -q PONG"; then return 0; fi
        kill -9 "$RP" 2>/dev/null
        [ -n "$fixed" ] || PORT=""
    done
    fail "redis-server did not start on port $PORT"
}
R() { redis-cli -p "$PORT" "$@" 2>/dev/null; }

# ---- daemon -----------------------------------------------------------------------------------

# start_daemon NAME NODE [extra args]: quantd with one CPU worker, the options of
# test_daemon_e2e.sh, log in $C/NAME.log; pid in $DPID.
start_daemon() {
    local name=$1 node=$2; shift 2
    "$B/quantd" --redis "redis://127.0.0.1:$PORT" --node "$node" --allow-root "$T" --workers cpu:1 \
        --heartbeat 1 --node-ttl-ms 2000 --lease-ttl-ms 3000 "$@" >>"$C/$name.log" 2>&1 &
    DPID=$!
    track "$DPID"
    wait_for 30 worker_pid "$DPID" >/dev/null || fail "quantd ($name) started no worker"
}
worker_pid() { pgrep -P "$1" quantd-worker | head -1; }
worker_up() { [ -n "$(worker_pid "$1")" ]; }
# stop_daemon PID [SECS]: SIGTERM, wait (bounded), then -9; returns the exit status (137 if
# it had to be killed).
stop_daemon() {
    local p=$1 s=${2:-30}
    kill -TERM "$p" 2>/dev/null
    if ! wait_for "$s" dead "$p"; then
        kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
        return 137
    fi
    wait "$p" 2>/dev/null
}

# ---- jobs -------------------------------------------------------------------------------------

H() { R HGET "qjob:$1" "$2"; }
state_is() { [ "$(H "$1" state)" = "$2" ]; }
state_in() { local s; s=$(H "$1" state); shift; local x; for x in "$@"; do [ "$s" = "$x" ] && return 0; done; return 1; }
final() { state_in "$1" done failed cancelled; }
hash_dump() { R HGETALL "qjob:$1" | tr '\n' ' ' | cut -c1-1500; }
# Where the worker is, from the status hash: "<stage> <block>" (block as the hash has it).
stage_of() { echo "$(H "$1" stage) $(H "$1" block)"; }
next_block() { sed -n 's/.*"next_block"[^0-9]*\([0-9]*\).*/\1/p' "$1/.quantd/state.json" 2>/dev/null | head -1; }
push() { R LPUSH qjobs "$1" >/dev/null; }
# failed_has TEXT: some qjobs:failed record's payload contains TEXT (records are JSON, and
# the Lua-written ones escape '/').
failed_has() { failed_reason "$1" | grep -q .; }
# failed_reason TEXT: the error of the newest qjobs:failed record whose payload contains TEXT.
failed_reason() {
    R LRANGE qjobs:failed 0 -1 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if sys.argv[1] in r.get("payload", ""):
        print(r.get("error", "") or "(no error)")
        break
' "$1"
}

# The assets: a random llama whose blocks take long enough to be interrupted (8 x 512,
# 32000-token vocabulary, so the final write moves ~65 MB), a tiny one for quick jobs, and
# pre-tokenized calibration ids (the generated models have no tokenizer).
make_assets() {
    mkdir -p "$T/assets"
    python3 - "$T/assets/calib.json" <<'PY' || return 1
import json, random, sys
r = random.Random(1)
json.dump([r.randrange(3, 128) for _ in range(4096)], open(sys.argv[1], "w"))
PY
}
make_big_model() {
    [ -d "$T/assets/big" ] || "$B/quantctl" gen-model --out "$T/assets/big" --layers 8 --hidden 512 \
        --vocab 32000 --max-pos 256 >/dev/null
}
make_tiny_model() {
    [ -d "$T/assets/tiny" ] || "$B/quantctl" gen-model --out "$T/assets/tiny" --layers 2 --hidden 64 >/dev/null
}
# gptq_job ID OUTPUT [MODEL] [extra JSON]: a GPTQ job on the big model with a small calibration set.
gptq_job() {
    echo "{\"id\":\"$1\",\"model\":\"${3:-$T/assets/big}\",\"output\":\"$2\",\"method\":\"gptq\",\"group_size\":32,\"backend\":\"cpu\",\"calibration\":{\"path\":\"$T/assets/calib.json\",\"samples\":8,\"seq_len\":128}${4:-}}"
}
# rtn_job ID OUTPUT [MODEL] [extra JSON]
rtn_job() {
    echo "{\"id\":\"$1\",\"model\":\"${3:-$T/assets/tiny}\",\"output\":\"$2\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"${4:-}}"
}

# digest DIR: one line per file below DIR, "sha256  relative/path", sorted; the report's
# run-dependent fields (id, output path, timings: *seconds*, *_ms, each block's "stages";
# resources.measured and .ratio, the peaks of memory and disk this run measured)
# are left out of its hash.
digest() {
    python3 - "$1" <<'PY'
import hashlib, json, os, sys
root = sys.argv[1]
def norm(o):
    if isinstance(o, dict):
        return {k: norm(v) for k, v in o.items()
                if k not in ("job_id", "id", "output", "stages", "measured", "ratio") and "seconds" not in k
                and not k.endswith("_ms")}
    if isinstance(o, list):
        return [norm(v) for v in o]
    return o
for d, dirs, files in os.walk(root):
    dirs.sort()
    for f in sorted(files):
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        data = open(p, "rb").read()
        if f == "quantd_report.json":
            data = json.dumps(norm(json.loads(data)), sort_keys=True).encode()
        print(hashlib.sha256(data).hexdigest() + "  " + rel)
PY
}
# same_output REF DIR: every file of REF is in DIR with the same bytes (the report compared
# without its timings), and DIR has nothing else (no .quantd left behind).
same_output() {
    digest "$1" >"$C/ref.digest" && digest "$2" >"$C/got.digest" || return 1
    if ! cmp -s "$C/ref.digest" "$C/got.digest"; then
        diff "$C/ref.digest" "$C/got.digest" >&2
        report_diff "$1/quantd_report.json" "$2/quantd_report.json" >&2
        return 1
    fi
}
# report_diff A B: the first few report fields that differ (timings and ids left out).
report_diff() {
    [ -f "$1" ] && [ -f "$2" ] || return 0
    python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
out = []
def walk(x, y, path):
    if len(out) >= 10:
        return
    key = path.rsplit(".", 1)[-1]
    if key in ("job_id", "id", "output", "stages", "measured", "ratio") or "seconds" in key or key.endswith("_ms"):
        return
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            walk(x.get(k), y.get(k), path + "." + k)
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            walk(u, v, "%s[%d]" % (path, i))
    elif x != y:
        out.append("report%s: %s (uninterrupted) vs %s" % (path, json.dumps(x)[:80], json.dumps(y)[:80]))
walk(a, b, "")
print("\n".join(out))
PY
}
# ref_output NAME JOBFN: the uninterrupted run of a job, in the foreground (quantctl quantize),
# into $T/ref/NAME (made once per script).
ref_output() {
    local name=$1 fn=$2
    [ -d "$T/ref/$name" ] && return 0
    mkdir -p "$T/ref"
    "$fn" "ref-$name" "$T/ref/$name" >"$T/ref/$name.json"
    "$B/quantctl" quantize "$T/ref/$name.json" >"$T/ref/$name.log" 2>&1 || { tail -5 "$T/ref/$name.log" >&2; return 1; }
}

# at_point ID POINT: the job is at POINT (block0 | mid | write) according to its status hash.
at_point() {
    local s b
    read -r s b <<<"$(stage_of "$1")"
    case $2 in
        block0) [ "$b" = 0 ] && [[ $s =~ ^(calibrate|quantize|forward)$ ]] ;;
        mid) [ "$b" = 4 ] && [[ $s =~ ^(calibrate|quantize|forward)$ ]] ;;
        write) [ "$s" = write ] ;;
    esac
}
# check_recovered ID NODE: ID ended done and left nothing behind in Redis (no entry in
# NODE's processing list, no lease).
check_recovered() {
    local id=$1 node=$2
    wait_for 60 final "$id" || fail "$id did not finish: $(hash_dump "$id")"
    state_is "$id" done || fail "$id ended $(H "$id" state): $(H "$id" error)"
    ! R LRANGE "qjobs:processing:$node" 0 -1 | grep -q "\"id\":\"$id\"" ||
        fail "$id left in the processing list: $(R LRANGE "qjobs:processing:$node" 0 -1 | cut -c1-300)"
    [ "$(R EXISTS "qjob:$id:lease")" = 0 ] || fail "lease of $id left behind"
    note "$id done, attempts=$(H "$id" attempts)"
}
# check_identical ID REF: ID's output is byte-identical to $T/ref/REF.
check_identical() {
    same_output "$T/ref/$2" "$C/$1" || fail "$1 output differs from the uninterrupted run (above)"
}
