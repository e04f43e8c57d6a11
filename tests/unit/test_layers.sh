#!/usr/bin/env bash
# Who may include whom (docs/architecture.md, "Layers"): every quoted #include of a source
# under the layered folders must name a header of its own layer or of a lower one. Fails,
# naming the file, the line and both layers, when a file reaches up (or sideways into
# another layer of the same rank), or includes a header that belongs to no layer.
#
# Usage: test_layers.sh [SOURCE_DIR]. The table below is the order; change it together with
# the architecture document.
set -euo pipefail
src=${1:-${QUANTD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}}
[ -d "$src/quant" ] || { echo "test_layers: no quant/ under $src" >&2; exit 2; }

# layer (a folder, relative to the source root) and rank: a file may include its own layer
# and any layer of a lower rank. Layers of one rank may not include each other.
layers='
quant/core      0
quant/formats   1
quant/job       2
quant/backend   3
quant/kernels   4
quant/algo      5
quant/model     6
quant/tp        7
quant/pipeline  8
startup         9
proto           9
workers         10
daemon          10
cli             10
'

cd "$src"
files=$(for d in $(echo "$layers" | awk 'NF { print $1 }'); do
            [ -d "$d" ] && find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)
        done | sort)
[ -n "$files" ] || { echo "test_layers: no sources found under $src" >&2; exit 2; }

# shellcheck disable=SC2086
awk -v layers="$layers" '
function layer_of(path,    i, best) {
    best = ""
    for (i = 1; i <= n; i++)
        if (index(path, name[i] "/") == 1 && length(name[i]) > length(best)) best = name[i]
    return best
}
BEGIN {
    m = split(layers, lines, "\n")
    for (i = 1; i <= m; i++) {
        if (split(lines[i], f, " ") == 2) { n++; name[n] = f[1]; rank[f[1]] = f[2] + 0 }
    }
}
/^[ \t]*#[ \t]*include[ \t]*"/ {
    inc = $0
    sub(/^[ \t]*#[ \t]*include[ \t]*"/, "", inc)
    sub(/".*/, "", inc)
    from = layer_of(FILENAME)
    to = layer_of(inc)
    if (to == "") {
        printf "%s:%d: includes \"%s\", which is in no layer\n", FILENAME, FNR, inc
        bad++
    } else if (to != from && rank[to] >= rank[from]) {
        printf "%s:%d: %s (rank %d) includes \"%s\" from %s (rank %d)\n", FILENAME, FNR, from, rank[from], inc, to, rank[to]
        bad++
    }
    checked++
}
END {
    if (bad) { printf "test_layers: %d include(s) against the layer order (docs/architecture.md, \"Layers\")\n", bad; exit 1 }
    printf "test_layers: %d includes in %d layers follow the order\n", checked, n
}' $files
