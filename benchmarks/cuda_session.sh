#!/usr/bin/env bash
# Issue 37's run on a lent GPU, in one call of a few minutes: correctness first (side by
# side, since none of it is timed), then the timings alone on the machine.
#
#   OUT=folder bash benchmarks/cuda_session.sh [references.pt]
#
# references.pt: the CPU side of benchmarks/cuda_check.py's parity checks, made where
# poolgrad's Numba kernels are already compiled (`python benchmarks/cuda_check.py
# --device cpu --save-references references.pt`); without it the check computes them
# here, which costs minutes of compiling. Everything lands in $OUT: env.txt, pytest.log,
# check.json and check.log, cli.log, timings.json and timings.log.
set -u
OUT=${OUT:-runs/cuda-session}
REFERENCES=${1:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PYTHON=${PYTHON:-python3}
stamp() { echo "[$(date +%T)] $*"; }

{
  nvidia-smi
  nproc
  $PYTHON -c "import torch, triton, numba, numpy; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'triton', triton.__version__, 'numba', numba.__version__, 'numpy', \
numpy.__version__); print(torch.cuda.get_device_name(0))"
  $PYTHON -c "import poolgrad.torch; print('poolgrad.torch imports')"
} > "$OUT/env.txt" 2>&1
stamp "env"; tail -4 "$OUT/env.txt"

# ---- correctness, side by side
stamp "correctness"
# SIGINT at the time box: pytest stops and still prints the failures' tracebacks
timeout -s INT -k 15 200 $PYTHON -m pytest -v --tb=short -n 10 --dist load -p no:cacheprovider \
  tests/test_triton.py tests/test_bench_cuda.py tests/test_study.py \
  "tests/test_train_torch.py::test_the_device_is_checked_before_any_work" \
  > "$OUT/pytest.log" 2>&1 &
tests=$!
check_args=(--out "$OUT/check.json")
[ -n "$REFERENCES" ] && check_args+=(--references "$REFERENCES")
timeout 200 $PYTHON benchmarks/cuda_check.py "${check_args[@]}" > "$OUT/check.log" 2>&1 &
check=$!
(
  set -x
  timeout 80 $PYTHON -m poolgrad study shift --quick --device cuda --workers 2 --quiet \
    --datasets digits16 \
    --out /tmp/study-gpu && ls -R /tmp/study-gpu | head -20
  timeout 50 $PYTHON -m poolgrad train --engine torch --device cuda --quiet \
    --epochs 10 --out /tmp/train-gpu && cat /tmp/train-gpu/metrics.json | head -c 600
  # a checkpoint written on the GPU goes on on the CPU
  timeout 25 $PYTHON -m poolgrad train --engine torch --device cpu --quiet --resume \
    --epochs 11 --out /tmp/train-gpu
  timeout 40 $PYTHON -m poolgrad train --engine torch --device cuda --quiet --pool soft \
    --epochs 5 --out /tmp/train-gpu-soft
) > "$OUT/cli.log" 2>&1 &
cli=$!
wait $tests; echo "pytest exit $?" >> "$OUT/pytest.log"
wait $check; echo "cuda_check exit $?" >> "$OUT/check.log"
wait $cli; echo "cli exit $?" >> "$OUT/cli.log"
stamp "correctness done"

# ---- timings, alone
# TIMINGS_ARGS: more arguments (--skip-layers: the kinds alone)
timeout "${TIMINGS_SECONDS:-300}" $PYTHON benchmarks/cuda_timings.py --out "$OUT/timings.json" \
  --seconds "${TIMINGS_DEADLINE:-250}" ${TIMINGS_ARGS:-} > "$OUT/timings.log" 2>&1
echo "timings exit $?" >> "$OUT/timings.log"
stamp "timings done"

grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
grep -E "^FAILED|^ERROR" "$OUT/pytest.log" | head -20
tail -8 "$OUT/check.log"
grep -E "accuracy|exit|Error|error" "$OUT/cli.log" | head -12
tail -5 "$OUT/timings.log"
