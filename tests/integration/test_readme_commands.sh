# The README's two commands, run from a fresh clone of this repository's committed HEAD
# with ../shared beside it as in CI: `scripts/setup.sh` (deps, release build, the demo job
# through Redis) and `scripts/test.sh` (deps, the sanitizer build, ctest) must both exit 0.
# The setup command once finished its demo and then exited 1 (its EXIT trap ran under
# `set -e`), so "it printed done" is not enough: the exit status is what is checked.
# To bound the time, both builds are CUDA-off (the main build compiles the CUDA code) and
# the inner test command runs one named test (ctest arguments pass through test.sh), which
# also keeps it from running this test again. The README marks its set-up block
# `norun=setup` (tests/docs_blocks.py); this test checks that the block still holds exactly
# these two commands, and tests/integration/test_docs_commands.sh runs the README's others.
SRC="${QUANTD_SOURCE_DIR:?}"
[ -n "${QUANTD_README_TEST_INNER:-}" ] && { echo "SKIP: nested run"; exit 77; }
command -v git >/dev/null || { echo "SKIP: git not installed"; exit 77; }
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
git -C "$SRC" rev-parse HEAD >/dev/null 2>&1 || { echo "SKIP: $SRC is not a git checkout"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# The README's set-up block names the two commands this test runs, and nothing else.
cmds=$(python3 "$SRC/tests/docs_blocks.py" blocks "$SRC" | python3 -c '
import json, sys
for b in json.load(sys.stdin)["blocks"]:
    if b["doc"] == "README.md" and b["reason"] == "setup":
        print(" ".join(l.split()[0] for l in b["body"] if l.strip() and not l.lstrip().startswith("#")))')
[ "$cmds" = "scripts/setup.sh scripts/test.sh" ] || fail "README's set-up block holds '$cmds', not scripts/setup.sh and scripts/test.sh"

git clone -q --no-hardlinks "$SRC" "$T/main" || { echo "FAIL: git clone"; exit 1; }
[ -n "${QUANTD_SHARED_DATA:-}" ] && [ -d "$QUANTD_SHARED_DATA" ] && ln -s "$(cd "$QUANTD_SHARED_DATA/.." && pwd)" "$T/shared"
cd "$T/main" || exit 1
echo "fresh clone of $(git rev-parse --short HEAD) in $T/main"

export QUANTD_CUDA=OFF QUANTD_README_TEST_INNER=1
QUANTD_DEMO_DIR="$T/demo" scripts/setup.sh >"$T/setup.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { fail "scripts/setup.sh exited $rc"; tail -30 "$T/setup.log" >&2; }
grep -q "^output: $T/demo/out" "$T/setup.log" || fail "the demo did not reach done (no output line)"
[ -f "$T/demo/out/quantd_report.json" ] || fail "the demo wrote no report"

scripts/test.sh -R '^test_proto_job$' >"$T/test.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { fail "scripts/test.sh exited $rc"; tail -30 "$T/test.log" >&2; }
grep -q "100% tests passed, 0 tests failed out of 1" "$T/test.log" || fail "the test command ran no test"

[ "$fails" -eq 0 ] && echo "both README commands exit 0 from a fresh clone"
exit $((fails > 0))
