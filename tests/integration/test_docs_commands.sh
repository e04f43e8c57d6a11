#!/usr/bin/env bash
# Every command a user would type from README.md, docs/*.md and bench/README.md, run and
# checked: the `run` blocks of each document (tests/docs_blocks.py says how a block is
# marked and how a command says what its output must contain) run in order, in one shell
# per document, against a world made for them:
#   - /srv/models/llama: a generated 2-layer llama (hidden 256, vocab 256) with a byte-level
#     tokenizer (vocab.json + merges.txt), so calibration text works;
#   - /srv/data/c4.jsonl (JSONL, field "text") and /srv/data/wiki.test.raw: generated text;
#   - /srv/quantized/ (empty), /tmp/;
#   - a throwaway redis-server on a free loopback port standing for 127.0.0.1:6379, and a
#     free port standing for the HTTP API's 127.0.0.1:8080;
#   - quantd, quantd-worker and quantctl of QUANTD_BUILD_DIR first on PATH.
# The documents' /srv/ and /tmp/ paths and the two ports are rewritten into that world,
# `redis-cli` gets the test's port, and `build/release` means the build under test. Blocks
# marked norun=REASON are counted by reason (tests/unit/test_docs_lint.sh checks their
# syntax). Each document gets at most DOCS_TIMEOUT seconds (default 240); a hung command is
# named. No wall-clock figure is asserted.
set -u
SRC="${QUANTD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
B="${QUANTD_BUILD_DIR:-}"
for x in quantd quantd-worker quantctl; do
    [ -x "$B/$x" ] || { echo "SKIP: $B/$x not built"; exit 77; }
done
for x in redis-server redis-cli curl python3 setsid; do
    command -v "$x" >/dev/null || { echo "SKIP: no $x"; exit 77; }
done
B=$(cd "$B" && pwd)
T=$(mktemp -d /tmp/qdocs-XXXXXX)
PGIDS=()
cleanup() {
    for g in "${PGIDS[@]}"; do kill -9 -- "-$g" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# How the blocks are marked is test_docs_lint's to check; here only the count is shown.
python3 "$SRC/tests/docs_blocks.py" lint "$SRC" | tail -1

# The blocks not run still name real things: a quantctl command that exists, a quantd that
# takes --help, scripts and files of this tree.
norun=0
while IFS=$'\t' read -r where w1 w2; do
    norun=$((norun + 1))
    case "$w1" in
    quantctl) "$B/quantctl" "$w2" --help >/dev/null 2>&1 || fail "$where: quantctl $w2 is not a quantctl command" ;;
    quantd) "$B/quantd" --help >/dev/null 2>&1 || fail "$where: quantd --help fails" ;;
    */*) [ -e "$SRC/$w1" ] || fail "$where: $w1 is not in the tree" ;;
    bash|python|python3) case "$w2" in */*) [ -e "$SRC/$w2" ] || fail "$where: $w2 is not in the tree" ;; esac ;;
    esac
done < <(python3 "$SRC/tests/docs_blocks.py" norun-words "$SRC")
echo "test_docs_commands: $norun command lines of blocks not run name existing commands and files"

# The world every document starts from (copied per document, so none sees another's files).
base="$T/base"
mkdir -p "$base/srv/data" "$base/srv/quantized" "$base/tmp"
"$B/quantctl" gen-model --out "$base/srv/models/llama" --layers 2 --hidden 256 --vocab 256 >/dev/null ||
    { echo "FAIL: gen-model"; exit 1; }
python3 - "$base" <<'PY' || { echo "FAIL: making the world's tokenizer and text"; exit 1; }
import json, random, sys
base = sys.argv[1]
# GPT-2's byte-level alphabet: 256 symbols, one token per byte (no merges).
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
order = sorted(range(256), key=lambda i: bs[i])
vocab = {chr(cs[i]): k for k, i in enumerate(order)}
model = base + "/srv/models/llama"
json.dump(vocab, open(model + "/vocab.json", "w"))
open(model + "/merges.txt", "w").write("#version: 0.2\n")
rng = random.Random(1)
words = ("the of and a to in is was for on that with as by at from his it an were are which this "
         "model weights quantized calibration tokens layer group scale serving kernel").split()
def para(n):
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."
with open(base + "/srv/data/c4.jsonl", "w") as f:
    for _ in range(48):
        f.write(json.dumps({"text": para(120)}) + "\n")
with open(base + "/srv/data/wiki.test.raw", "w") as f:
    for _ in range(12):
        f.write(" = Section = \n " + para(150) + "\n")
PY

export PATH="$B:$PATH" QUANTD_LOG=warn OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2} QUANTD_THREADS=${QUANTD_THREADS:-2}
total=0 checked=0
docs=$(cd "$SRC" && python3 tests/docs_blocks.py blocks . | python3 -c '
import json, sys
seen = []
for b in json.load(sys.stdin)["blocks"]:
    if b["run"] and b["doc"] not in seen:
        seen.append(b["doc"])
print("\n".join(seen))')
for doc in $docs; do
    name=$(echo "$doc" | tr '/.' '__')
    W="$T/w-$name"; OUT="$T/out-$name"
    mkdir -p "$W" "$OUT"
    cp -a "$base/." "$W/"
    RP=$(port); HP=$(port)
    redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$W" >"$OUT/redis.log" 2>&1 &
    rpid=$!
    for _ in $(seq 100); do redis-cli -p "$RP" PING >/dev/null 2>&1 && break; sleep 0.1; done
    python3 "$SRC/tests/docs_blocks.py" script "$SRC" "$doc" "$W" "$RP" "$HP" "$OUT" >"$OUT/run.sh" ||
        { fail "$doc: could not write its script"; continue; }
    setsid timeout -k 5 "${DOCS_TIMEOUT:-240}" bash "$OUT/run.sh" >"$OUT/stdout" 2>&1 &
    sp=$!
    PGIDS+=("$sp")
    wait "$sp"
    rc=$?
    kill -9 -- "-$sp" 2>/dev/null    # whatever the document started and left behind
    kill "$rpid" 2>/dev/null; wait "$rpid" 2>/dev/null
    touch "$OUT/results"
    total=$((total + $(wc -l <"$OUT/results")))
    checked=$((checked + $(grep -v -e '(background)$' -e '(exit status only)' "$OUT/results" | wc -l)))
    if [ "$(cat "$OUT/current" 2>/dev/null)" != done ]; then
        fail "$doc: stopped (exit $rc) during the command at $(cat "$OUT/current" 2>/dev/null)"
        n=$(ls "$OUT" | grep -c '^[0-9]*\.log$')
        tail -20 "$OUT/$n.log" >&2
    fi
    while IFS= read -r line; do
        case "$line" in
        ok*) echo "  ${line#ok [0-9]* }" ;;
        FAIL*)
            rest=${line#FAIL }
            n=${rest%% *}
            fail "${rest#* }"
            sed 's/^/    | /' "$OUT/$n.log" | tail -25 >&2 ;;
        esac
    done <"$OUT/results"
done

echo "test_docs_commands: $total commands run, $checked of them checked on their output (the others: background, or print nothing)"
[ "$fails" -eq 0 ] && echo "every runnable documented command gave what its document says"
exit $((fails > 0))
