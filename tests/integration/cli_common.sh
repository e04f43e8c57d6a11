# Sourced by the quantctl end-to-end tests: $Q (the quantctl under test, from
# QUANTD_BUILD_DIR), skips (exit 77) without it or python3, a temporary directory $T removed
# on exit, and fail() counting failures into $fails.
Q="${QUANTD_BUILD_DIR:?QUANTD_BUILD_DIR must point at the build directory}/quantctl"
[ -x "$Q" ] || { echo "SKIP: $Q not built"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 needed to read quantctl's JSON output"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
