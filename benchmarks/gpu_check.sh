#!/usr/bin/env bash
# Runtime-overhead benchmark on a CUDA GPU: NCCL, bf16 (the GPU variant of runtime_overhead.py).
#
# For a session that is lent a GPU machine through the device tool; never run by CI. The device
# machine (nvidia-h200) has torch, accelerate, click and pyyaml but not libcst, so convert the
# workload HERE first and carry the converted script along:
#
#   python benchmarks/runtime_overhead.py --convert-only
#   run(command="bash benchmarks/gpu_check.sh", carry=["benchmarks/.work/runtime"], timeout_s=480)
#
# It uses one process per GPU (at most 2; one H200 gives world size 1, where hand-written DDP
# still wraps the model and distify and Accelerate do not), 5 rounds of the three variants plus
# the isolated per-step measurement, about 3-5 minutes. The results land in
# benchmarks/results/runtime_gpu.md, and in $OUT when it is set so they come back.
#
# GPU_CHECK_ALLOW_CPU=1 runs the same plumbing on the CPU with a small workload (a dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    if [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
        echo "gpu_check: no CUDA device visible (GPU_CHECK_ALLOW_CPU=1 for a CPU dry run)" >&2
        exit 2
    fi
fi
$PY - <<'EOF'
import torch
if torch.cuda.is_available():
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} x "
          f"{torch.cuda.get_device_name(0)}, bf16 supported: {torch.cuda.is_bf16_supported()}")
else:
    print(f"torch {torch.__version__}, no GPU: CPU dry run")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader || true

NPROC=$($PY -c "import torch; print(min(2, torch.cuda.device_count()) or 2)")
CONVERTED=benchmarks/.work/runtime/train_distify.py
CONVERT_ARGS=()
if ! $PY -c "import libcst, click, yaml" 2>/dev/null; then
    if [ ! -f "$CONVERTED" ]; then
        echo "gpu_check: libcst is not installed here and $CONVERTED is missing: run" \
             "'python benchmarks/runtime_overhead.py --convert-only' where distify is" \
             "installed and carry benchmarks/.work/runtime" >&2
        exit 2
    fi
    CONVERT_ARGS=(--converted "$CONVERTED")
fi

# A workload big enough for the GPU to do real work, small enough for a few seconds a run.
SCRIPT_ARGS="--features 1024 --hidden 4096 --batch-size 256 --samples 65536 --epochs 2 --warmup 50"
RESULTS=benchmarks/results/runtime_gpu.md
if [ "${GPU_CHECK_ALLOW_CPU:-0}" = 1 ] && ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    SCRIPT_ARGS="--samples 2560 --epochs 2 --warmup 10"
    RESULTS=benchmarks/.work/runtime_gpu_dryrun.md
fi

status=0
$PY benchmarks/runtime_overhead.py "${CONVERT_ARGS[@]}" --nproc "$NPROC" \
    --mixed-precision bf16 --rounds "${ROUNDS:-5}" --script-args "$SCRIPT_ARGS" \
    --results "$RESULTS" --run-timeout 240 || status=$?
if [ -n "${OUT:-}" ] && [ -f "$RESULTS" ]; then
    cp "$RESULTS" "$OUT/"
fi
exit $status
