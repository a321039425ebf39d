#!/usr/bin/env bash
# The device checks in one call: where the layer's GPU time goes, issue 15's GPU benchmark, then
# `pytest -m gpu`, logs under $OUT.
#
#   run: bash benchmarks/gpu_checks.sh [BENCH_SECONDS] [PYTEST_SECONDS]   (carry: .whl)
#   BENCH_ROWS=1,2,10 LAYER_PRECISION=fp8-delayed bash benchmarks/gpu_checks.sh ...
#   (a subset of the benchmark's rows; the precision whose layer kernels are listed)
#
# The lent machine has torch with CUDA but neither platformdirs nor optuna/ray: platformdirs travels
# as a wheel in the git-ignored .whl/, made here once with
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 -d .whl platformdirs
# Tests that need optuna or ray skip there. A run of everything takes about 4 minutes on an H100.
set -u
bench_s=${1:-330}
pytest_s=${2:-180}
out=${OUT:-/tmp/gpu_checks}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu \
    --format=csv | tee "$out/nvidia_smi.txt"
timeout 120 python3 benchmarks/profile_layer_kernels.py --precision "${LAYER_PRECISION:-bf16}" 2>&1 | tee "$out/layer_kernels.log"
timeout "$bench_s" python3 benchmarks/bench_issue15_gpu.py ${BENCH_ROWS:+--rows "$BENCH_ROWS"} 2>&1 \
    | tee "$out/bench_issue15_gpu.log"
echo "bench exit ${PIPESTATUS[0]}"
timeout "$pytest_s" python3 -m pytest -m gpu -p no:cacheprovider -rfEs -q tests 2>&1 | tee "$out/pytest_gpu.log" | grep -v "^SKIPPED.*optuna\|^SKIPPED.*ray"
echo "pytest exit ${PIPESTATUS[0]}"
