#!/usr/bin/env bash
# bench/parts_project.py (docs/parallel.md, "What it gains") on the daemon logs and reports of
# two measured blocks (tests/data/parts_project: bench/parts.sh's 2-worker runs of a 7B-shaped
# block with calibration.shards 2 and of a Mixtral-shaped block whose experts' passes were cut
# by experts, with the report of that block's 1-worker run, kept with PARTS_KEEP, their logs
# cut to the lines the script reads and their paths replaced):
#   - timeline lists every fan-out of the 7B block (capture and quantize, in the order of a
#     true-sequential block, and the last forward's capture parts) and the lead's time alone;
#     and, of the second block of a later build's two-block run (7b2: the down projection's
#     factor step with its trace parts, the residual stream from the kept context as capture
#     parts), those fan-outs too, and project composes that block within 5% as well;
#   - project composes the measured blocks from their own rates within 5% of their measured
#     seconds, and prints the Llama-3-70B and DeepSeek-V3 tables (every expert's hooks seeing
#     every token, and the routed ones only, which cost less) with finite positive hours that
#     fall as workers are added;
#   - bad input (a missing file, a report for a log, a report of another shape, a report that is
#     not JSON, --check-1 or --moe-1 without its argument) is refused with a message, never a
#     traceback.
set -u
S=${QUANTD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
D="$S/tests/data/parts_project"
P="$S/bench/parts_project.py"
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
T=$(mktemp -d /tmp/qpproj-XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 "$P" timeline "$D/7b-daemon.txt" >"$T/tl.md" || fail "timeline"
steps=$(sed -n 's/^| [0-9]* | \([a-z]*\) |.*/\1/p' "$T/tl.md" | tr '\n' ' ')
[ "$steps" = "capture quantize capture quantize capture quantize capture quantize capture " ] ||
    fail "timeline's fan-outs: $steps"
grep -q "^the lead alone: [0-9.]* s of [0-9.]* s" "$T/tl.md" || fail "timeline: no lead-alone line"
python3 "$P" timeline "$D/7b2-daemon.txt" --block 1 >"$T/tl2.md" || fail "timeline --block 1"
steps=$(sed -n 's/^| [0-9]* | \([a-z]*\) |.*/\1/p' "$T/tl2.md" | tr '\n' ' ')
[ "$steps" = "capture quantize capture quantize capture capture quantize capture factor quantize capture " ] ||
    fail "timeline --block 1's fan-outs: $steps"
python3 "$P" project "$D/7b2-daemon.txt" "$D/7b2-report.json" --block 1 --check-1 "$(cat "$D/7b2-1-seconds")" >"$T/pr2.md" ||
    fail "project --block 1"
python3 - "$T/pr2.md" <<'PY' || fail "project --block 1's tables: $(cat "$T/pr2.md")"
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"^\| 2 \| ([0-9.]+) \| ([0-9.]+) \|$", t, re.M)
assert m, "no composed 2-worker row"
got, meas = float(m.group(1)), float(m.group(2))
assert abs(got - meas) <= 0.05 * meas, (got, meas)
body = t.split("## Llama-3-70B", 1)[1]
h = [float(r.strip("|").split("|")[-1]) for r in body.splitlines() if re.match(r"^\| (1|8|16)[ ,|]", r)]
assert len(h) == 3 and all(0 < x < 1e6 for x in h) and h[0] > h[1] >= h[2], h
PY

python3 "$P" project "$D/7b-daemon.txt" "$D/7b-report.json" "$D/mixtral-daemon.txt" "$D/mixtral-report.json" \
    --check-1 "$(cat "$D/7b-1-seconds")" --moe-1 "$D/mixtral-1-report.json" >"$T/pr.md" || fail "project"
python3 - "$T/pr.md" <<'PY' || fail "project's tables: $(cat "$T/pr.md")"
import re, sys
t = open(sys.argv[1]).read()
# the 7B block at 2 workers, composed against measured
m = re.search(r"^\| 2 \| ([0-9.]+) \| ([0-9.]+) \|$", t, re.M)
assert m, "no composed 2-worker row"
got, meas = float(m.group(1)), float(m.group(2))
assert abs(got - meas) <= 0.05 * meas, (got, meas)
m = re.search(r"composed at 2 workers: ([0-9]+) s \(measured ([0-9]+) s.*cut by experts", t)
assert m, "no MoE composition (of a block whose experts' passes were cut)"
got, meas = float(m.group(1)), float(m.group(2))
assert abs(got - meas) <= 0.05 * meas, (got, meas)
assert re.search(r"composed at 1 worker: [0-9]+ s \(measured in memory [0-9]+ s", t), "no 1-worker MoE composition"
def hours(section, label=""):
    body = t.split(section, 1)[1].split("\n## ", 1)[0]
    rows = [r for r in body.splitlines() if re.match(r"^\| " + label + r"(1|8|16)[ ,|]", r)]
    return [float(r.strip("|").split("|")[-1]) for r in rows]
# DeepSeek-V3 with every expert's hooks seeing every token (the default) and the routed ones only
for sec, label in (("## Llama-3-70B", ""), ("## DeepSeek-V3", r"every token \| "), ("## DeepSeek-V3", r"their routed tokens \| ")):
    h = hours(sec, label)
    assert len(h) == 3, (sec, h)
    assert all(x > 0 and x < 1e6 for x in h), (sec, h)
    assert h[0] > h[1] >= h[2], (sec, h)
assert hours("## DeepSeek-V3", r"every token \| ")[0] > hours("## DeepSeek-V3", r"their routed tokens \| ")[0]
PY
# Bad input: a clear message and exit 1, never a traceback.
bad() {   # bad WHAT ARGS...: the script refuses ARGS
    local what=$1; shift
    python3 "$P" "$@" >"$T/bad.out" 2>"$T/bad.err" && fail "$what: accepted"
    grep -q "Traceback" "$T/bad.err" && fail "$what: a traceback: $(cat "$T/bad.err")"
    grep -q "parts_project\|no task_start" "$T/bad.err" || fail "$what: no message: $(cat "$T/bad.err")"
}
bad "a missing log" project "$T/none.log" "$D/7b-report.json"
bad "a report for a log" timeline "$D/7b-report.json"
bad "a MoE report for the dense block" project "$D/7b-daemon.txt" "$D/mixtral-report.json"
bad "a report that is not JSON" project "$D/7b-daemon.txt" "$D/7b-daemon.txt"
bad "--check-1 without seconds" project "$D/7b-daemon.txt" "$D/7b-report.json" --check-1
bad "--block without a number" project "$D/7b-daemon.txt" "$D/7b-report.json" --block
bad "--block of a block the log lacks" timeline "$D/7b-daemon.txt" --block 5
bad "--moe-1 without a report" project "$D/7b-daemon.txt" "$D/7b-report.json" "$D/mixtral-daemon.txt" \
    "$D/mixtral-report.json" --moe-1
echo PASS
