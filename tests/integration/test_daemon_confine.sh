#!/usr/bin/env bash
# Jobs are untrusted input (issue #33, confinement), end to end through one daemon run with
# --allow-root $T/root and QUANTD_MAX_JSON_BYTES=4096, against a real redis-server on a random
# loopback port. Each bad model is a copy of a tiny generated llama with one file replaced:
#   (a) special_tokens_map.json a symbolic link to a JSON file outside the root holding a
#       secret: the job ends failed naming the file and "outside the allowed roots", and the
#       secret is nowhere under the root (output, checkpoint), in Redis or in the logs;
#   (b) config.json a symbolic link to /dev/zero, and (where mknod is allowed) config.json a
#       character device 1:5 (/dev/zero) made inside the root: each job fails (the device one
#       naming "a character device"), the daemon and its worker never grow past a bound
#       while it runs (checked at every poll: a reader of /dev/zero grows without end),
#       /healthz answers and the next good job runs;
#   (c) tokenizer.json a FIFO with no writer: the job fails (within the bounded wait; an open
#       of a FIFO for reading blocks forever) naming "a FIFO";
#   (d) config.json over the 4096-byte JSON limit (a long "_pad" string; the daemon gets the
#       limit from its environment, QUANTD_MAX_JSON_BYTES=4096, and passes it to its worker as
#       --max-json-bytes): refused naming the limit of 4096 bytes and its setting;
#   (e) a good job on the unmodified model runs to done on the same daemon, before and after
#       the bad ones, and so does one on a model laid out as a Hugging Face cache snapshot
#       (every file a symbolic link to ../../blobs/<name>, inside the root: links that stay
#       inside the roots still work); the worker was started with the daemon's limit and root.
# Without openat2/RESOLVE_BENEATH confinement (a) copies the secret into the output; without
# the regular-file rule (b) reads /dev/zero until the memory bound trips and (c) hangs; without
# the limits (d) runs to done. Every wait is bounded polling; no duration is asserted.
set -u
DC_NAME=qdd-confine
. "$(dirname "$0")/daemon_common.sh"
command -v python3 >/dev/null || { echo "SKIP: python3 needed"; exit 77; }
command -v mkfifo >/dev/null || { echo "SKIP: mkfifo needed"; exit 77; }

ROOT=$T/root
OUT=$T/outside
mkdir -p "$ROOT" "$OUT"
SECRET="qd-secret-$RANDOM$RANDOM-do-not-copy"
printf '{"bos_token": "%s"}\n' "$SECRET" >"$OUT/secret.json"
# RSS bound, in KiB, for the daemon and for each of its workers while a bad job runs. Far
# above what a sanitizer build of either uses here, far below what reading /dev/zero reaches.
RSS_MAX_KB=$((1536 * 1024))

redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" >"$T/redis.log" 2>&1 &
RP=$!
wait_for 5 sh -c "redis-cli -p $PORT PING 2>/dev/null | grep -q PONG" || fail "redis-server did not start"

"$B/quantctl" gen-model --out "$ROOT/tiny" --layers 2 --hidden 64 >/dev/null || fail "gen-model"
# mk NAME: a copy of the tiny model in $ROOT/NAME.
mk() { cp -r "$ROOT/tiny" "$ROOT/$1"; }
mk m-link
ln -s "$OUT/secret.json" "$ROOT/m-link/special_tokens_map.json"
mk m-zero
rm "$ROOT/m-zero/config.json"
ln -s /dev/zero "$ROOT/m-zero/config.json"
mk m-fifo
mkfifo "$ROOT/m-fifo/tokenizer.json"
# A Hugging Face cache layout: snapshots/<rev>/<file> -> ../../blobs/<file>.blob.
mkdir -p "$ROOT/hf/blobs" "$ROOT/hf/snapshots/r1"
for f in "$ROOT"/tiny/*; do
    b=$(basename "$f")
    cp "$f" "$ROOT/hf/blobs/$b.blob"
    ln -s "../../blobs/$b.blob" "$ROOT/hf/snapshots/r1/$b"
done
DEV=0
mk m-dev
rm "$ROOT/m-dev/config.json"
mknod "$ROOT/m-dev/config.json" c 1 5 2>/dev/null && DEV=1
mk m-pad
python3 - "$ROOT/m-pad/config.json" <<'PY' || fail "could not pad config.json"
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["_pad"] = "p" * 8000
json.dump(c, open(p, "w"))
PY
[ "$(stat -c %s "$ROOT/m-pad/config.json")" -gt 4096 ] || fail "the padded config.json is not over 4096 bytes"
[ "$(stat -c %s "$ROOT/tiny/config.json")" -lt 4096 ] || fail "the tiny model's config.json is not under 4096 bytes"

QUANTD_MAX_JSON_BYTES=4096 "$B/quantd" --redis "redis://127.0.0.1:$PORT" --node c1 --allow-root "$ROOT" \
    --workers cpu:1 --heartbeat 1 --node-ttl-ms 2000 --lease-ttl-ms 3000 --http "127.0.0.1:$HP" >"$T/d.log" 2>&1 &
DPID=$!
U="http://127.0.0.1:$HP"
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/readyz")" = 200 ]; }
healthy() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/healthz")" = 200 ]; }
wait_for 60 ready || fail "quantd not ready"

H() { R HGET "qjob:$1" "$2" 2>/dev/null; }
final() { case "$(H "$1" state)" in done | failed | cancelled) return 0 ;; esac; return 1; }
job() { echo "{\"id\":\"$1\",\"model\":\"$ROOT/$2\",\"output\":\"$ROOT/out/$1\",\"method\":\"rtn\",\"group_size\":32,\"backend\":\"cpu\"}"; }
push() { R LPUSH qjobs "$(job "$1" "$2")" >/dev/null; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
# bounded PID: PID and each of its children hold at most RSS_MAX_KB resident; on a breach it
# says which and fails at once (before the machine runs out of memory).
bounded() {
    local p r
    for p in "$1" $(pgrep -P "$1"); do
        r=$(rss_kb "$p")
        [ "${r:-0}" -le "$RSS_MAX_KB" ] || fail "pid $p ($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-60)) holds ${r} KiB"
    done
}
# final_bounded ID: ID is final, and (each poll) the daemon is alive and within its memory.
final_bounded() {
    kill -0 "$DPID" 2>/dev/null || fail "quantd died (while $1 ran)"
    bounded "$DPID"
    final "$1"
}
# run_bad ID MODEL REGEX...: ID on MODEL ends failed, with an error matching every REGEX.
run_bad() {
    local id=$1 model=$2; shift 2
    push "$id" "$model"
    wait_for 120 final_bounded "$id" || fail "$id did not finish within the bounded wait: $(R HGETALL "qjob:$id" | tr '\n' ' ' | cut -c1-600)"
    [ "$(H "$id" state)" = failed ] || fail "$id ended $(H "$id" state), not failed"
    local err rx
    err=$(H "$id" error)
    for rx in "$@"; do
        grep -qE -- "$rx" <<<"$err" || fail "$id's error does not match /$rx/: $err"
    done
    echo "   $id: $err" | cut -c1-300
}
run_good() {
    push "$1" "${2:-tiny}"
    wait_for 120 final_bounded "$1" || fail "$1 did not finish: $(R HGETALL "qjob:$1" | tr '\n' ' ' | cut -c1-600)"
    [ "$(H "$1" state)" = "done" ] || fail "$1 ended $(H "$1" state): $(H "$1" error)"
    [ -f "$ROOT/out/$1/config.json" ] || fail "$1 wrote no config.json"
}

echo "== the worker is started with the daemon's root and JSON limit"
W=$(pgrep -P "$DPID" quantd-worker | head -1)
[ -n "$W" ] || fail "no worker"
args=$(tr '\0' ' ' <"/proc/$W/cmdline")
grep -q -- "--max-json-bytes 4096" <<<"$args" || fail "worker args lack --max-json-bytes 4096: $args"
grep -q -- "--allow-root $ROOT" <<<"$args" || fail "worker args lack --allow-root $ROOT: $args"

echo "== (e) a good job first"
run_good good1

echo "== (a) special_tokens_map.json links out of the root"
run_bad c-link m-link "special_tokens_map\.json" "outside the allowed roots"
grep -rqF -- "$SECRET" "$ROOT" && fail "the secret was copied under the root: $(grep -rlF -- "$SECRET" "$ROOT")"
R --scan --pattern '*' | while read -r k; do
    case "$(R TYPE "$k")" in
        hash) R HGETALL "$k" ;; list) R LRANGE "$k" 0 -1 ;; string) R GET "$k" ;; zset) R ZRANGE "$k" 0 -1 ;;
        stream) R XRANGE "$k" - + ;; set) R SMEMBERS "$k" ;;
    esac
done | grep -qF -- "$SECRET" && fail "the secret is in Redis"
grep -qF -- "$SECRET" "$T/d.log" && fail "the secret is in the daemon's log"

echo "== (b) config.json links to /dev/zero"
run_bad c-zero m-zero "config\.json" "refused|not a regular file|outside"
kill -0 "$DPID" 2>/dev/null || fail "quantd died"
healthy || fail "/healthz not 200 after the /dev/zero job"
if [ $DEV = 1 ]; then
    run_bad c-dev m-dev "config\.json" "a character device"
    kill -0 "$DPID" 2>/dev/null || fail "quantd died"
    healthy || fail "/healthz not 200 after the character-device job"
else
    echo "   (mknod not permitted here: the character device inside the root is not tried)"
fi
echo "   daemon rss $(rss_kb "$DPID") KiB"

echo "== (c) tokenizer.json is a FIFO"
run_bad c-fifo m-fifo "tokenizer\.json" "a FIFO"

echo "== (d) config.json over --max-json-bytes 4096"
run_bad c-pad m-pad "config\.json" "limit of 4096 bytes" "QUANTD_MAX_JSON_BYTES|max-json-bytes"

echo "== (e) the same daemon runs a good job after the bad ones, and one through links inside the root"
run_good good2
run_good good-hf hf/snapshots/r1
healthy || fail "/healthz not 200 at the end"
R LRANGE qjobs:failed 0 -1 | grep -q '"id":"good' && fail "a good job is in the failed list"

kill -TERM "$DPID"; wait "$DPID"; rc=$?; DPID=
[ $rc = 0 ] || fail "quantd exited $rc on SIGTERM"
grep -q "ERROR: LeakSanitizer\|ERROR: AddressSanitizer\|runtime error:" "$T/d.log" && fail "sanitizer report in the daemon's log"
echo "PASS"
