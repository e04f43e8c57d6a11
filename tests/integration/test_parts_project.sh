#!/usr/bin/env bash
# bench/parts_project.py (docs/parallel.md, "What it gains") on the daemon logs and reports of
# two measured blocks (tests/data/parts_project: bench/parts.sh's 2-worker runs of a 7B-shaped
# block with calibration.shards 2 and of a Mixtral-shaped block, kept with PARTS_KEEP, their
# logs cut to the lines the script reads and their paths replaced):
#   - timeline lists every fan-out of the 7B block (capture and quantize, in the order of a
#     true-sequential block, and the last forward's capture parts) and the lead's time alone;
#   - project composes the measured blocks from their own rates within 5% of their measured
#     seconds, and prints the Llama-3-70B and DeepSeek-V3 tables with finite positive hours
#     that fall as workers are added;
#   - bad input (a missing file, a report for a log, a report of another shape, a report that is
#     not JSON, --check-1 without its seconds) is refused with a message, never a traceback.
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

python3 "$P" project "$D/7b-daemon.txt" "$D/7b-report.json" "$D/mixtral-daemon.txt" "$D/mixtral-report.json" \
    --check-1 "$(cat "$D/7b-1-seconds")" >"$T/pr.md" || fail "project"
python3 - "$T/pr.md" <<'PY' || fail "project's tables: $(cat "$T/pr.md")"
import re, sys
t = open(sys.argv[1]).read()
# the 7B block at 2 workers, composed against measured
m = re.search(r"^\| 2 \| ([0-9.]+) \| ([0-9.]+) \|$", t, re.M)
assert m, "no composed 2-worker row"
got, meas = float(m.group(1)), float(m.group(2))
assert abs(got - meas) <= 0.05 * meas, (got, meas)
m = re.search(r"composed at 2 workers: ([0-9]+) s \(measured ([0-9]+) s", t)
assert m, "no MoE composition"
got, meas = float(m.group(1)), float(m.group(2))
assert abs(got - meas) <= 0.05 * meas, (got, meas)
def hours(section):
    body = t.split(section, 1)[1].split("\n## ", 1)[0]
    rows = [r for r in body.splitlines() if re.match(r"^\| (1|8|16)[ ,|]", r)]
    return [float(r.strip("|").split("|")[-1]) for r in rows]
for sec in ("## Llama-3-70B", "## DeepSeek-V3"):
    h = hours(sec)
    assert len(h) == 3, (sec, h)
    assert all(x > 0 and x < 1e6 for x in h), (sec, h)
    assert h[0] > h[1] >= h[2], (sec, h)
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
echo PASS
