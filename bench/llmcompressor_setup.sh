#!/usr/bin/env bash
# The llm-compressor environment for bench/llmcompressor.sh (optional bench, never part of
# the build or ctest).
#
#   bench/llmcompressor_setup.sh VENV [BASE_VENV]
#
# VENV gets llmcompressor 0.14.0.1 and the few packages it needs that BASE_VENV lacks;
# torch and the rest come from BASE_VENV (default build/families-venv, the venv
# tests/families/run.sh makes: torch 2.15.0, transformers 5.23.0) through a .pth file
# appended after VENV's own site-packages, so torch (2+ GB with its CUDA wheels) is not
# downloaded again. llmcompressor 0.14.0.1 pins torch<=2.14.0 and transformers<=5.17.0,
# compressed-tensors==0.19.0: transformers 5.17.0 and compressed-tensors 0.19.0 are
# installed into VENV (they shadow BASE_VENV's 5.23.0 / 0.20.0); torch stays 2.15.0, one
# minor above the pin (llmcompressor itself is installed --no-deps for that reason, the
# rest of its requirements are resolved with torch held at 2.15.0). The pip freeze of the
# result goes to VENV/freeze.txt.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:?usage: bench/llmcompressor_setup.sh VENV [BASE_VENV]}"
base="$(cd "${2:-$root/build/families-venv}" && pwd)"
py="$base/bin/python"
ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ -d "$base/lib/python$ver/site-packages/torch" ] || { echo "llmcompressor_setup.sh: no torch in $base" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
    python$ver -m venv "$venv"
fi
echo "$base/lib/python$ver/site-packages" > "$venv/lib/python$ver/site-packages/zz-base-venv.pth"
tv=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
echo "torch==$tv" > "$venv/constraints.txt"
"$venv/bin/pip" install -q --no-deps "llmcompressor==0.14.0.1"
"$venv/bin/pip" install -q -c "$venv/constraints.txt" "transformers==5.17.0" "compressed-tensors==0.19.0" \
    "datasets>=4.8.4" "nvidia-ml-py>=12.560.30" "pillow>=10.4.0" "auto-round==0.15.1"
"$venv/bin/pip" freeze > "$venv/freeze.txt"
"$venv/bin/python" -c 'import llmcompressor, torch, transformers, compressed_tensors as ct; print("llmcompressor", llmcompressor.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "compressed-tensors", ct.__version__)'
