#!/usr/bin/env bash
# quantctl gen-model --shard-size end to end (issue #19): a model sharded by size gives the
# same logits as the one-file model of the same seed (quantctl logits, compared byte for
# byte), its index names the shard of every tensor and the data size of all of them, each
# shard keeps to the limit; 2G-style suffixes read as 2GB; bad sizes and out-of-range
# options exit 2 naming the option.
set -u
. "$(dirname "$0")/cli_common.sh"

opts=(--layers 3 --hidden 128 --intermediate 352 --heads 4 --kv-heads 2 --vocab 256 --max-pos 64 --dtype bf16 --seed 11)
"$Q" gen-model --out "$T/one" "${opts[@]}" >/dev/null || fail "gen-model one file"
"$Q" gen-model --out "$T/sh" "${opts[@]}" --shard-size 100KB >/dev/null || fail "gen-model sharded"
"$Q" gen-model --out "$T/sh2" "${opts[@]}" --shard-size 100K >/dev/null || fail "gen-model sharded, bare K"
[ -f "$T/one/model.safetensors" ] || fail "no model.safetensors without --shard-size"
[ -e "$T/sh/model.safetensors" ] && fail "a sharded model also has model.safetensors"

python3 - "$T/one" "$T/sh" 100000 <<'EOF' || fail "index or shards wrong"
import json, os, re, struct, sys
one, sh, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
def tensors(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        h = json.loads(f.read(n)); h.pop('__metadata__', None)
        for k, v in h.items():
            f.seek(8 + n + v['data_offsets'][0])
            yield k, (v['dtype'], v['shape'], f.read(v['data_offsets'][1] - v['data_offsets'][0]))
ref = dict(tensors(one + '/model.safetensors'))
idx = json.load(open(sh + '/model.safetensors.index.json'))
shards = sorted(f for f in os.listdir(sh) if f.endswith('.safetensors'))
n = len(shards)
assert n > 2, shards
assert shards == ['model-%05d-of-%05d.safetensors' % (i + 1, n) for i in range(n)], shards
got, total = {}, 0
for s in shards:
    t = dict(tensors(sh + '/' + s))
    size = sum(len(v[2]) for v in t.values())
    assert size <= limit or len(t) == 1, (s, size)
    for k in t: assert idx['weight_map'][k] == s, (k, s)
    got.update(t); total += size
assert got == ref, 'tensors differ from the one-file model'
assert set(idx['weight_map']) == set(ref)
assert idx['metadata']['total_size'] == total, (idx['metadata'], total)
EOF
for f in "$T/sh"/*; do cmp -s "$f" "$T/sh2/$(basename "$f")" || fail "--shard-size 100K differs from 100KB: $f"; done

python3 -c 'import json; print(json.dumps([(i * 37) % 256 for i in range(24)]))' > "$T/ids.json"
"$Q" logits --model "$T/one" --tokens "$T/ids.json" --out "$T/one.bin" --threads 1 >/dev/null || fail "logits one file"
"$Q" logits --model "$T/sh" --tokens "$T/ids.json" --out "$T/sh.bin" --threads 1 >/dev/null || fail "logits sharded"
cmp -s "$T/one.bin" "$T/sh.bin" || fail "sharded and one-file logits differ"

# 70B-shaped limits are accepted (cheaply: the widths one at a time).
"$Q" gen-model --out "$T/deep" --layers 80 --hidden 32 --heads 1 --intermediate 32 --vocab 32 >/dev/null \
    || fail "80 layers refused"
"$Q" gen-model --out "$T/wide" --layers 1 --hidden 32 --heads 1 --intermediate 28672 --vocab 32 >/dev/null \
    || fail "intermediate 28672 refused"

# expect_usage NAME PATTERN ARGS...: exit 2 and one stderr line matching PATTERN
expect_usage() {
    local name=$1 pat=$2; shift 2
    local err rc
    err=$("$Q" gen-model --out "$T/bad" "$@" 2>&1 >/dev/null); rc=$?
    [ "$rc" = 2 ] || fail "$name: exit $rc (want 2): $err"
    echo "$err" | grep -q -- "$pat" || fail "$name: message '$err' lacks '$pat'"
}
expect_usage "zero shard size" "--shard-size must be a positive" --shard-size 0
expect_usage "negative shard size" "--shard-size must be a positive" --shard-size -5MB
expect_usage "unknown unit" "--shard-size must be a positive" --shard-size 2X
expect_usage "no number" "--shard-size must be a positive" --shard-size GB
expect_usage "layers 0" "--layers must be 1..512" --layers 0
expect_usage "layers text" "--layers must be 1..512" --layers many
expect_usage "hidden too big" "--hidden must be 32..16384" --hidden 16416
expect_usage "hidden not x32" "--hidden must be a multiple of 32" --hidden 100
expect_usage "intermediate too big" "--intermediate must be 1..65536" --intermediate 70000
expect_usage "heads not dividing" "--heads 3 must divide --hidden 64" --heads 3
expect_usage "kv-heads not dividing" "--kv-heads 3 must divide --heads 4" --heads 4 --kv-heads 3
[ -e "$T/bad" ] && fail "a refused gen-model created its directory"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "test_cli_gen_model: all checks passed"
