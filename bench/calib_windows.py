"""quantd's GPTQ-style calibration windows (quant/model/calib.c qd_calib_sample_random:
splitmix64 seeded with SEED, Lemire's unbiased uniform start in [0, n - seq_len)), cut
from a token stream written by `quantctl tokenize --jsonl`, written as one flat JSON
array of SAMPLES * SEQ_LEN ids. A job reading that file with calibration style "awq"
(consecutive blocks; a token file is never shuffled) sees exactly these windows, in order.

    python3 bench/calib_windows.py STREAM.json SAMPLES SEQ_LEN SEED OUT.json
"""
import json, sys

M = (1 << 64) - 1

def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return state, z ^ (z >> 31)

def uniform(state, rng):
    state, x = splitmix64(state)
    m = x * rng
    lo = m & M
    if lo < rng:
        t = ((1 << 64) - rng) % rng
        while lo < t:
            state, x = splitmix64(state)
            m = x * rng
            lo = m & M
    return state, m >> 64

src, samples, seq_len, seed, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ids = json.load(open(src))
if isinstance(ids, dict): ids = ids["tokens"]
st, rng, res = seed, len(ids) - seq_len, []
for _ in range(samples):
    st, s = uniform(st, rng)
    res.extend(ids[s:s + seq_len])
json.dump(res, open(out, "w"))
print(json.dumps({"samples": samples, "seq_len": seq_len, "seed": seed, "stream_tokens": len(ids), "out": out}))
