#!/usr/bin/env bash
# The GPU checks, one after another, on one CUDA GPU: what the machine has, the accelerate
# engines (plain / FSDP2 / DeepSpeed ZeRO-3, with resume), bf16 vision-language training,
# generation backends with the PRM on the GPU, and tests/test_gpu.py.
#
#   bash benchmarks/gpu/run_all.sh OUT
#
# Run from the repository root with betaprm importable (pip install -e . or PYTHONPATH=src).
# Each check writes OUT/<check>/ and OUT/<check>.json; OUT/summary.txt says which passed.
# DeepSpeed and vLLM are optional: a check whose package is missing says so in its JSON.
set -u
out=${1:?usage: bash benchmarks/gpu/run_all.sh OUT}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py=${PYTHON:-python3}
step() {  # step NAME SECONDS CMD...: run with a time limit, log to OUT/NAME.log, note the outcome
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$out/summary.txt"
}
: > "$out/summary.txt"
step env 60 $py benchmarks/gpu/env.py "$out/env.json"
step engines 300 $py benchmarks/gpu/engines.py "$out/engines"
step vlm_bf16 90 $py benchmarks/gpu/vlm_bf16.py "$out/vlm"
prm="$out/engines/run_plain"; [ -f "$prm/betaprm_config.json" ] || prm=""
step generation 150 $py benchmarks/gpu/generation.py "$out/generation" ${prm:+--prm "$prm"}
step test_gpu 90 $py -m pytest -q -p no:cacheprovider tests/test_gpu.py
for f in engines/engines.json vlm/vlm_bf16.json generation/generation.json; do
    [ -f "$out/$f" ] && cp "$out/$f" "$out/"
done
exit 0
