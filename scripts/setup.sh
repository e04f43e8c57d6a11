#!/usr/bin/env bash
# The set-up command: installs missing Debian packages, builds quantd (release), and runs
# the demo (scripts/demo.sh) on a built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DQUANTD_CUDA=${QUANTD_CUDA:-AUTO} >/dev/null
cmake --build build/release -j"$(nproc)"
exec scripts/demo.sh build/release
