#!/usr/bin/env bash
# quantctl eval end to end on generated models (no shared data needed): perplexity as one
# JSON line; --ref-model against itself gives KL 0 and full top-1 agreement, against another
# model a positive KL; bad input (missing reference, another vocabulary, windows longer than
# the context, missing options, an absent or unknown --backend; and gen-model's expert flags and
# estimate's job file) exits 2 with one line naming
# the problem.
set -u
. "$(dirname "$0")/cli_common.sh"
json() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])[sys.argv[1]])' "$1"; }

"$Q" gen-model --out "$T/a" --seed 1 --vocab 128 --max-pos 128 >/dev/null || fail "gen-model a"
"$Q" gen-model --out "$T/b" --seed 2 --vocab 128 --max-pos 128 >/dev/null || fail "gen-model b"
"$Q" gen-model --out "$T/v96" --seed 3 --vocab 96 --max-pos 128 >/dev/null || fail "gen-model v96"
python3 -c 'import json, random; random.seed(5); print(json.dumps([random.randrange(96) for _ in range(512)]))' > "$T/ids.json"

out=$("$Q" eval --model "$T/a" --tokens "$T/ids.json" --seq-len 64) || fail "plain eval exited $?"
[ "$(echo "$out" | json windows)" = 8 ] || fail "plain eval: windows: $out"
echo "$out" | grep -q kl_mean && fail "plain eval reports a KL without a reference: $out"

out=$("$Q" eval --model "$T/a" --ref-model "$T/a" --tokens "$T/ids.json" --seq-len 64) || fail "self eval exited $?"
python3 -c 'import json,sys; r = json.loads(sys.argv[1]); assert r["kl_mean"] == 0 and r["top1_agree"] == 1 and r["ref_ppl"] == r["ppl"], r' "$out" \
    || fail "self comparison: $out"

out=$("$Q" eval --model "$T/a" --ref-model "$T/b" --tokens "$T/ids.json" --seq-len 64) || fail "cross eval exited $?"
python3 -c 'import json,sys; r = json.loads(sys.argv[1]); assert r["kl_mean"] > 0 and r["kl_max"] >= r["kl_mean"] and 0 <= r["top1_agree"] < 1, r' "$out" \
    || fail "cross comparison: $out"

# expect_usage NAME PATTERN -- ARGS...: exit 2 and one stderr line matching PATTERN
expect_usage() {
    local name=$1 pat=$2; shift 3
    local err rc
    err=$("$Q" "$@" 2>&1 >/dev/null); rc=$?
    [ "$rc" = 2 ] || fail "$name: exit $rc (want 2): $err"
    echo "$err" | grep -q -- "$pat" || fail "$name: message '$err' lacks '$pat'"
}
expect_usage "missing reference" "nonexistent" -- eval --model "$T/a" --ref-model "$T/nonexistent" --tokens "$T/ids.json" --seq-len 64
expect_usage "other vocabulary" "cannot be compared" -- eval --model "$T/a" --ref-model "$T/v96" --tokens "$T/ids.json" --seq-len 64
expect_usage "window too long" "max_position_embeddings" -- eval --model "$T/a" --ref-model "$T/b" --tokens "$T/ids.json" --seq-len 256
expect_usage "no ref value" "needs a value" -- eval --model "$T/a" --tokens "$T/ids.json" --seq-len 64 --ref-model
expect_usage "absent device" "cuda:99" -- eval --model "$T/a" --tokens "$T/ids.json" --seq-len 64 --backend cuda:99
expect_usage "bad backend" "unknown spec" -- eval --model "$T/a" --tokens "$T/ids.json" --seq-len 64 --backend gpu
# gen-model's experts and estimate's job file: bad input refused with the reason.
expect_usage "too many experts" "--experts must be 0..256" -- gen-model --out "$T/x1" --experts 300
expect_usage "experts on opt" "llama only" -- gen-model --out "$T/x2" --arch opt --experts 4
expect_usage "top-k over experts" "--top-k 1..experts" -- gen-model --out "$T/x3" --experts 4 --top-k 5
printf '{"model": "%s/a"' "$T" > "$T/bad-job.json"
expect_usage "estimate of a broken job" "invalid JSON" -- estimate "$T/bad-job.json"
expect_usage "estimate of no job" "cannot open" -- estimate "$T/no-such-job.json"

# --backend cpu is the default: the same perplexity, and the line names the backend.
a=$("$Q" eval --model "$T/a" --tokens "$T/ids.json" --seq-len 64) || fail "default eval"
b=$("$Q" eval --model "$T/a" --tokens "$T/ids.json" --seq-len 64 --backend cpu) || fail "cpu eval"
[ "$(echo "$a" | json ppl)" = "$(echo "$b" | json ppl)" ] || fail "--backend cpu differs: $a vs $b"
[ "$(echo "$b" | json backend)" = cpu ] || fail "backend not named: $b"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "test_cli_eval: all checks passed"
