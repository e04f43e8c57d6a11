#!/usr/bin/env bash
# Chaos: bad jobs. Over 40 kinds of bad payload, each pushed with redis-cli LPUSH to one
# daemon: bad JSON, bad fields and types, bad values, paths that are relative, outside the
# allowed root, escaping it by ".." or a symbolic link, missing, or not what they should be,
# and models that are broken on disk (no config.json, truncated or incomplete safetensors, a
# NaN weight, an unsupported architecture). Each must end failed with an error that matches
# what was wrong (the field or the file): refused at admission into qjobs:failed (with a
# failed status hash when it carries a valid id), or, for what only a worker can see, a
# failed status hash after a bounded number of attempts. The daemon must stay up and run a
# good job afterwards. The table of kinds and the errors the daemon gave is printed at the
# end (and kept in $T/badjobs/table.md while the script runs).
. "$(dirname "$0")/chaos_common.sh"

make_assets && make_tiny_model || { echo "FAIL: could not make the test model"; exit 1; }

# Broken copies of the tiny model (float32 safetensors).
make_broken_models() {
    local m=$T/assets/tiny d=$T/assets/broken
    mkdir -p "$d"
    for x in nocfg trunc notensor nan arch; do cp -r "$m" "$d/$x"; done
    rm "$d/nocfg/config.json"
    mkdir -p "$d/empty"
    python3 - "$d" <<'PY'
import json, math, os, struct, sys
d = sys.argv[1]
def read(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
def write(p, hdr, data):
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    open(p, "wb").write(struct.pack("<Q", len(h)) + h + data)
st = "model.safetensors"
# Truncated: the file ends half-way through its data.
p = os.path.join(d, "trunc", st)
size = os.path.getsize(p)
os.truncate(p, size // 2)
# A tensor missing: one linear of block 0 dropped, offsets kept contiguous.
p = os.path.join(d, "notensor", st)
hdr, data = read(p)
drop = "model.layers.0.mlp.up_proj.weight"
assert drop in hdr, sorted(hdr)
out, new, off = {}, b"", 0
items = sorted(((k, v) for k, v in hdr.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
for k, v in items:
    if k == drop:
        continue
    a, b = v["data_offsets"]
    new += data[a:b]
    out[k] = dict(v, data_offsets=[off, off + b - a])
    off += b - a
if "__metadata__" in hdr:
    out["__metadata__"] = hdr["__metadata__"]
write(p, out, new)
# A NaN in a weight the job quantizes.
p = os.path.join(d, "nan", st)
hdr, data = read(p)
t = hdr["model.layers.1.self_attn.q_proj.weight"]
assert t["dtype"] == "F32"
a = t["data_offsets"][0] + 4 * 5
data = data[:a] + struct.pack("<f", math.nan) + data[a + 4:]
write(p, hdr, data)
# An architecture quantd does not have.
p = os.path.join(d, "arch", "config.json")
c = json.load(open(p))
c["architectures"] = ["GPTNeoXForCausalLM"]
c["model_type"] = "gpt_neox"
json.dump(c, open(p, "w"))
PY
}

badjobs() {
    make_broken_models || fail "could not make the broken models"
    local M=$T/assets/tiny BR=$T/assets/broken CAL=$T/assets/calib.json O=$C/out
    mkdir -p "$C/p" "$C/calibdir"
    : >"$C/empty.bin"
    echo "this is not json" >"$C/garbage.json"
    ln -s /etc "$C/link-etc"
    ln -s /tmp "$C/link-tmp"
    local n=0
    # kind TAG ID REGEX STAGE PAYLOAD: one bad job. STAGE: admit (must be in qjobs:failed) or
    # run (a failed status hash after the worker tried it).
    kind() {
        n=$((n + 1))
        printf '%s' "$5" >"$C/p/$n.payload"
        printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >"$C/p/$n.meta"
    }
    # g ID [extra JSON]: a valid job body (RTN, group size 32, CPU, its own output) with the
    # extra fields; method, group_size and backend are left to the extra when it names them.
    g() {
        local x=${2:-} d=""
        [[ $x == *'"method"'* ]] || d+=',"method":"rtn"'
        [[ $x == *'"group_size"'* ]] || d+=',"group_size":32'
        [[ $x == *'"backend"'* ]] || d+=',"backend":"cpu"'
        echo "\"id\":\"$1\",\"model\":\"$M\",\"output\":\"$O/$1\"$d$x"
    }
    local big; big=$(python3 -c 'print("x" * 70000)')
    kind "malformed JSON" "" "invalid JSON|JSON" admit '{"id":"b-mal","model":'
    kind "JSON array, not an object" "" "object" admit '[1,2,3]'
    kind "JSON string, not an object" "" "object" admit '"just a string"'
    kind "JSON number" "" "object" admit '42'
    kind "empty string" "" "empty|JSON|object" admit ''
    kind "whitespace only" "" "empty|JSON|object" admit '   '
    kind "payload over max-job-bytes" "" "max-job-bytes|bytes" admit "{$(g b-huge ",\"pad\":\"$big\"")}"
    kind "trailing garbage after the object" "" "after|trailing|JSON" admit "{$(g b-trail)} xyz"
    kind "unknown key (bitz)" "b-unknown" "bitz" admit "{$(g b-unknown ',"bitz":4')}"
    kind "key given twice" "b-twice" "bits" admit "{$(g b-twice ',"bits":4,"bits":8')}"
    kind "model not a string" "b-tmodel" "job.model" admit '{"id":"b-tmodel","model":42,"output":"'"$O"'/x","method":"rtn","group_size":32}'
    kind "output not a string" "b-tout" "job.output" admit '{"id":"b-tout","model":"'"$M"'","output":["x"],"method":"rtn","group_size":32}'
    kind "method not a string" "b-tmethod" "job.method" admit "{$(g b-tmethod ',"method":1')}"
    kind "bits a string" "b-tbits" "job.bits" admit "{$(g b-tbits ',"bits":"4"')}"
    kind "group_size fractional" "b-tgs" "job.group_size" admit "{$(g b-tgs ',"group_size":128.5')}"
    kind "sym a string" "b-tsym" "job.sym" admit "{$(g b-tsym ',"sym":"yes"')}"
    kind "overwrite a number" "b-tover" "job.overwrite" admit "{$(g b-tover ',"overwrite":1')}"
    kind "priority a string" "b-tprio" "job.priority" admit "{$(g b-tprio ',"priority":"high"')}"
    kind "calibration a string" "b-tcal" "job.calibration" admit "{$(g b-tcal ',"calibration":"c4"')}"
    kind "id a number" "" "job.id" admit "{\"id\":7,\"model\":\"$M\",\"output\":\"$O/b-tid\",\"method\":\"rtn\"}"
    kind "bits 5" "b-bits" "job.bits" admit "{$(g b-bits ',"bits":5')}"
    kind "group_size 0" "b-gs0" "job.group_size" admit "{$(g b-gs0 ',"group_size":0')}"
    kind "group_size -2" "b-gsneg" "job.group_size" admit "{$(g b-gsneg ',"group_size":-2')}"
    kind "group_size 48 on 64-wide layers" "b-gs48" "group|48" run "{$(g b-gs48 ',"group_size":48')}"
    kind "unknown method" "b-method" "job.method" admit "{$(g b-method ',"method":"gguf"')}"
    kind "unknown format" "b-format" "job.format" admit "{$(g b-format ',"format":"exl2"')}"
    kind "awq_gemm at 3 bits" "b-awq3" "job.format" admit "{$(g b-awq3 ',"format":"awq_gemm","bits":3')}"
    kind "damp_percent 1.5" "b-damp" "job.damp_percent" admit "{$(g b-damp ',"damp_percent":1.5')}"
    kind "newer spec version" "b-version" "job.version" admit "{$(g b-version ',"version":2')}"
    kind "model missing" "b-nomodel" "job.model" admit '{"id":"b-nomodel","output":"'"$O"'/b-nomodel","method":"rtn","group_size":32}'
    kind "gptq without calibration" "b-nocal" "job.calibration" admit "{$(g b-nocal ',"method":"gptq"')}"
    kind "negative calibration samples" "b-samples" "job.calibration.samples" admit "{$(g b-samples ",\"method\":\"gptq\",\"calibration\":{\"path\":\"$CAL\",\"samples\":-1}")}"
    kind "calibration seq_len 0" "b-seqlen" "job.calibration.seq_len" admit "{$(g b-seqlen ",\"method\":\"gptq\",\"calibration\":{\"path\":\"$CAL\",\"seq_len\":0}")}"
    kind "id with invalid characters" "" "job.id" admit "{$(g 'a b/c')}"
    kind "id starting with -" "" "job.id" admit "{$(g -dash)}"
    kind "id of 65 characters" "" "job.id" admit "{$(g "$(printf 'i%.0s' $(seq 65))")}"
    kind "relative model path" "b-relm" "job.model.*absolute" admit '{"id":"b-relm","model":"models/tiny","output":"'"$O"'/b-relm","method":"rtn","group_size":32}'
    kind "relative output path" "b-relo" "job.output.*absolute" admit '{"id":"b-relo","model":"'"$M"'","output":"out/b-relo","method":"rtn","group_size":32}'
    kind "model outside the allowed root" "b-rootm" "job.model.*outside" admit '{"id":"b-rootm","model":"/etc","output":"'"$O"'/b-rootm","method":"rtn","group_size":32}'
    kind "output outside the allowed root" "b-rooto" "job.output.*outside" admit '{"id":"b-rooto","model":"'"$M"'","output":"/var/tmp/qd-chaos-never","method":"rtn","group_size":32}'
    kind "output escaping by .." "b-dotdot" "job.output.*outside" admit '{"id":"b-dotdot","model":"'"$M"'","output":"'"$T"'/../qd-chaos-escape","method":"rtn","group_size":32}'
    kind "model escaping by a symlink" "b-symm" "job.model.*outside" admit '{"id":"b-symm","model":"'"$C"'/link-etc","output":"'"$O"'/b-symm","method":"rtn","group_size":32}'
    kind "output escaping by a symlink" "b-symo" "job.output.*outside" admit '{"id":"b-symo","model":"'"$M"'","output":"'"$C"'/link-tmp/qd-chaos-escape","method":"rtn","group_size":32}'
    kind "calibration outside the allowed root" "b-rootc" "job.calibration.path.*outside" admit "{$(g b-rootc ',"method":"gptq","calibration":{"path":"/etc/hostname"}')}"
    kind "missing model directory" "b-nodir" "$T/nope|no such|not found|does not exist" any '{"id":"b-nodir","model":"'"$T"'/nope","output":"'"$O"'/b-nodir","method":"rtn","group_size":32}'
    kind "model directory without config.json" "b-nocfg" "config.json" any '{"id":"b-nocfg","model":"'"$BR"'/nocfg","output":"'"$O"'/b-nocfg","method":"rtn","group_size":32}'
    kind "empty model directory" "b-emptydir" "config.json" any '{"id":"b-emptydir","model":"'"$BR"'/empty","output":"'"$O"'/b-emptydir","method":"rtn","group_size":32}'
    kind "truncated safetensors" "b-trunc" "model.safetensors" run '{"id":"b-trunc","model":"'"$BR"'/trunc","output":"'"$O"'/b-trunc","method":"rtn","group_size":32}'
    kind "safetensors missing a tensor" "b-notensor" "up_proj" run '{"id":"b-notensor","model":"'"$BR"'/notensor","output":"'"$O"'/b-notensor","method":"rtn","group_size":32}'
    kind "NaN in a weight" "b-nan" "q_proj.*(NaN|finite)" run '{"id":"b-nan","model":"'"$BR"'/nan","output":"'"$O"'/b-nan","method":"rtn","group_size":32}'
    kind "unsupported architecture" "b-arch" "GPTNeoX|gpt_neox|architecture" any '{"id":"b-arch","model":"'"$BR"'/arch","output":"'"$O"'/b-arch","method":"rtn","group_size":32}'
    kind "calibration file missing (token ids)" "b-calmiss" "nope.json" any "{$(g b-calmiss ",\"method\":\"gptq\",\"calibration\":{\"path\":\"$T/nope.json\"}")}"
    kind "calibration text without a tokenizer" "b-caltok" "tokenizer" any "{$(g b-caltok ",\"method\":\"gptq\",\"calibration\":{\"path\":\"$T/nope.jsonl\"}")}"
    kind "calibration path a directory" "b-caldir" "calibdir.*directory" any "{$(g b-caldir ",\"method\":\"gptq\",\"calibration\":{\"path\":\"$C/calibdir\"}")}"
    kind "empty calibration file (token ids)" "b-calempty" "empty.bin" any "{$(g b-calempty ",\"method\":\"gptq\",\"calibration\":{\"path\":\"$C/empty.bin\",\"samples\":4,\"seq_len\":32}")}"
    kind "calibration ids not JSON" "b-calbad" "garbage.json" any "{$(g b-calbad ",\"method\":\"gptq\",\"calibration\":{\"path\":\"$C/garbage.json\",\"samples\":4,\"seq_len\":32}")}"
    kind "eval path missing" "b-evalmiss" "eval.*nope.raw" any "{$(g b-evalmiss ",\"eval\":{\"path\":\"$T/nope.raw\"}")}"
    kind "desc_act with rtn" "b-descact" "job.desc_act" admit "{$(g b-descact ',"desc_act":true')}"
    kind "tp_aware without act-order" "b-tpaware" "job.layout" admit "{$(g b-tpaware ',"layout":"tp_aware","tp":2')}"
    kind "shard_size a bad string" "b-shard" "job.shard_size" admit "{$(g b-shard ',"shard_size":"4 parsecs"')}"
    kind "unknown backend" "b-backend" "job.backend" admit "{$(g b-backend ',"backend":"tpu"')}"

    start_redis
    start_daemon d1 n1
    local i
    for i in $(seq 1 $n); do R LPUSH qjobs "$(cat "$C/p/$i.payload")" >/dev/null || fail "LPUSH $i failed"; done
    push "$(rtn_job good "$C/good")"
    note "pushed $n bad jobs and one good one"
    # Settled: every payload is in qjobs:failed or its job's hash is final, and the good job ended.
    settled() {
        final good || return 1
        R LRANGE qjobs:failed 0 -1 >"$C/failed.txt"
        python3 - "$C" "$n" <<'PY'
import json, subprocess, sys
c, n = sys.argv[1], int(sys.argv[2])
payloads = set()
for line in open(c + "/failed.txt"):
    line = line.strip()
    if line:
        try:
            payloads.add(json.loads(line)["payload"])
        except Exception:
            pass
for i in range(1, n + 1):
    p = open("%s/p/%d.payload" % (c, i)).read()
    if p in payloads:
        continue
    if open("%s/p/%d.state" % (c, i)).read().strip() in ("done", "failed", "cancelled"):
        continue
    sys.exit(1)
PY
    }
    refresh_states() {
        local i id
        for i in $(seq 1 $n); do
            id=$(cut -f2 "$C/p/$i.meta")
            if [ -n "$id" ]; then H "$id" state >"$C/p/$i.state"; else : >"$C/p/$i.state"; fi
        done
    }
    poll() { refresh_states; settled; }
    wait_for 240 poll || fail "not every bad job ended within 240 s (good job: $(H good state))"
    alive "$DPID" || fail "quantd died"
    state_is good done || fail "the good job pushed after the bad ones ended $(H good state): $(H good error)"
    for i in $(seq 1 $n); do
        id=$(cut -f2 "$C/p/$i.meta")
        [ -n "$id" ] || continue
        H "$id" error >"$C/p/$i.herr"
        H "$id" attempts >"$C/p/$i.attempts"
        grep -c "task_start worker=[^ ]* job=$id " "$C/d1.log" >"$C/p/$i.tasks"
    done
    # The verdicts and the table, one row per kind.
    python3 - "$C" "$n" "$T" <<'PY'
import json, re, sys
c, n, t = sys.argv[1], int(sys.argv[2]), sys.argv[3]
recs = {}
for line in open(c + "/failed.txt"):
    line = line.strip()
    if line:
        try:
            r = json.loads(line)
            recs.setdefault(r["payload"], r["error"])
        except Exception:
            pass
def rd(i, ext):
    try:
        return open("%s/p/%d.%s" % (c, i, ext)).read().strip()
    except OSError:
        return ""
rows, bad = [], []
for i in range(1, n + 1):
    kind, jid, rx, stage = rd(i, "meta").split("\t")
    p = open("%s/p/%d.payload" % (c, i)).read()
    state, herr = rd(i, "state"), rd(i, "herr")
    where = "qjobs:failed" if p in recs else ("status hash" if state else "nowhere")
    err = recs.get(p) or herr
    why = []
    if where == "nowhere":
        why.append("not in qjobs:failed and no status hash")
    if stage == "admit" and p not in recs:
        why.append("not refused at admission (no qjobs:failed entry)")
    if jid and state != "failed":
        why.append("status hash state is %r, not failed" % state)
    if jid and p in recs and herr != recs[p]:
        why.append("status hash error differs from the qjobs:failed reason")
    if not re.search(rx, err or "", re.I):
        why.append("error does not match /%s/" % rx)
    tasks = rd(i, "tasks") or "0"
    if int(tasks) > 4:
        why.append("ran %s tasks (retried beyond max-retries)" % tasks)
    note = ("attempts %s, tasks %s" % (rd(i, "attempts") or "0", tasks)) if jid and p not in recs else ""
    shown = (err or "").replace(t, "$T").replace("|", "\\|")
    if len(shown) > 300:
        shown = shown[:300] + "..."
    rows.append("| %d | %s | %s | %s | %s |" % (i, kind, where + (" (" + note + ")" if note else ""), shown,
                                                 "ok" if not why else "FAIL: " + "; ".join(why)))
    if why:
        bad.append("%s: %s" % (kind, "; ".join(why)))
with open(c + "/table.md", "w") as f:
    f.write("| # | bad job | ended in | error the daemon gave | verdict |\n|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(c + "/table.md").read())
if bad:
    print("\n".join("FAIL: " + b for b in bad), file=sys.stderr)
    sys.exit(1)
PY
    [ $? = 0 ] || fail "some bad jobs were not handled as expected (table above)"
    [ "$(R LLEN qjobs)" = 0 ] && [ "$(R LLEN qjobs:processing:n1)" = 0 ] || fail "queue or processing list not empty"
    [ ! -e /var/tmp/qd-chaos-never ] && [ ! -e /tmp/qd-chaos-escape ] || fail "a job wrote outside the allowed root"
}

run_case bad-jobs badjobs
finish
