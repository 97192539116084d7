#!/usr/bin/env bash
# Runtime-overhead benchmark on a CUDA GPU, NCCL, bf16: the GPU variant of runtime_overhead.py,
# both of its parts:
#
#   - DDP rows (part "mlp"): the converted MLP script vs hand-written DDP vs Accelerate, autocast
#     bf16, plus the isolated per-step measurement;
#   - FSDP rows (part "fsdp"): a small transformer under hand-written FSDP2, distify's FSDP
#     strategy, distify's DDP strategy and hand-written DDP; bf16 as FSDP's mixed-precision
#     policy (DISTIFY_MIXED_PRECISION=bf16: weights gathered in bf16, gradients reduced in fp32;
#     the hand-written FSDP2 script sets the same policy); peak memory per rank from
#     torch.cuda.max_memory_allocated().
#
# For a session that is lent a GPU machine through the device tool; never run by CI. The device
# machine (nvidia-h200) has torch, accelerate, click and pyyaml but not libcst, and no network, so
# convert both workloads HERE first and carry the converted scripts along:
#
#   python benchmarks/runtime_overhead.py --convert-only
#   run(command="bash benchmarks/gpu_check.sh", carry=["benchmarks/.work/runtime"], timeout_s=540)
#
# It uses one process per GPU (at most 2; one H200 gives world size 1, where distify wraps and
# shards nothing while the hand-written scripts still wrap in DDP or shard over a one-rank mesh),
# ROUNDS rounds of the DDP rows (default 3) and ROUNDS_FSDP of the FSDP rows (default 3), about
# 5-7 minutes on one H200; PARTS="fsdp" (or "mlp") runs one part (about 3 minutes each). The
# results land in benchmarks/results/runtime_gpu.md, and in $OUT when it is set so they come back.
#
# Without CUDA it runs what needs none (versions, the converted scripts, FSDP2's API and its bf16
# policy in this torch), reports each GPU part as "skipped: no CUDA" and exits 0.
# GPU_CHECK_ALLOW_CPU=1 instead runs the whole plumbing on the CPU with small workloads (a dry run,
# results in benchmarks/.work/runtime_gpu_dryrun.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PARTS=${PARTS:-mlp fsdp}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

HAVE_CUDA=$($PY -c "import torch; print(int(torch.cuda.is_available()))")
if [ "$HAVE_CUDA" != 1 ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: nvidia-smi lists a GPU but torch.cuda.is_available() is False" \
         "(a CPU-only torch, or CUDA_VISIBLE_DEVICES hides it): not a skip, a broken setup" >&2
    nvidia-smi -L >&2
    exit 2
fi

# ---------------------------------------------------------------- checks that need no GPU
$PY - <<'EOF'
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401  FSDP2

MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
if torch.cuda.is_available():
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} x "
          f"{torch.cuda.get_device_name(0)}, bf16 supported: {torch.cuda.is_bf16_supported()}, "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
else:
    print(f"torch {torch.__version__}, no CUDA; FSDP2 (fully_shard, MixedPrecisionPolicy) "
          "importable")
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader || true

declare -A CONVERTED=([mlp]=benchmarks/.work/runtime/train_distify.py
                      [fsdp]=benchmarks/.work/runtime/train_blocks_distify.py)
declare -A FLAG=([mlp]=--converted [fsdp]=--converted-blocks)
CONVERT_ARGS=()
if $PY -c "import libcst, click, yaml" 2>/dev/null; then
    # distify is installed here: convert now (the benchmark converts again in its run).
    # shellcheck disable=SC2086
    $PY benchmarks/runtime_overhead.py --convert-only --parts $PARTS >/dev/null
    echo "gpu_check: converted the workloads of: $PARTS"
else
    for part in $PARTS; do
        if [ ! -f "${CONVERTED[$part]}" ]; then
            echo "gpu_check: libcst is not installed here and ${CONVERTED[$part]} is missing:" \
                 "run 'python benchmarks/runtime_overhead.py --convert-only' where distify is" \
                 "installed and carry benchmarks/.work/runtime" >&2
            exit 2
        fi
        CONVERT_ARGS+=("${FLAG[$part]}" "${CONVERTED[$part]}")
    done
    echo "gpu_check: using the carried converted scripts (${CONVERT_ARGS[*]})"
fi

# ---------------------------------------------------------------- the GPU parts
if [ "$HAVE_CUDA" != 1 ] && [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
    for part in $PARTS; do
        case $part in
            mlp) echo "gpu_check: DDP rows (CUDA, NCCL, bf16 autocast): skipped: no CUDA" ;;
            fsdp) echo "gpu_check: FSDP rows (CUDA, NCCL, bf16 mixed-precision policy):" \
                       "skipped: no CUDA" ;;
        esac
    done
    echo "gpu_check: (GPU_CHECK_ALLOW_CPU=1 runs the same plumbing on the CPU as a dry run)"
    exit 0
fi

NPROC=$($PY -c "import torch; print(min(2, torch.cuda.device_count()) or 2)")
ROUNDS=${ROUNDS:-3}
ROUNDS_FSDP=${ROUNDS_FSDP:-3}
RESULTS=benchmarks/results/runtime_gpu.md
# Workloads big enough for the GPU to do real work, small enough for a few seconds a run: the
# MLP at width 4096; a 117M-parameter transformer (8 layers of width 1024, 4,096 tokens a step
# per process; about 1.9 GB of weights, gradients and AdamW state unsharded).
SCRIPT_ARGS="--features 1024 --hidden 4096 --batch-size 256 --samples 65536 --epochs 2 --warmup 50"
FSDP_SCRIPT_ARGS="--width 1024 --layers 8 --heads 16 --vocab 8192 --length 512 --batch-size 8"
FSDP_SCRIPT_ARGS+=" --samples $((60 * 8 * NPROC)) --warmup 10"
if [ "$HAVE_CUDA" != 1 ]; then  # GPU_CHECK_ALLOW_CPU=1: the dry run
    SCRIPT_ARGS="--samples 2560 --epochs 2 --warmup 10"
    FSDP_SCRIPT_ARGS="--samples 160 --warmup 4"
    ROUNDS=1
    ROUNDS_FSDP=1
    RESULTS=benchmarks/.work/runtime_gpu_dryrun.md
fi

status=0
# The committed fixtures first (about 80 s at 8 at a time): each original against its golden
# conversion on CUDA, results in benchmarks/results/gpu_fixtures.md.
if [ "$HAVE_CUDA" = 1 ]; then
    $PY benchmarks/gpu_fixtures.py --jobs 8 || status=$?
fi
# shellcheck disable=SC2086
$PY benchmarks/runtime_overhead.py --parts $PARTS "${CONVERT_ARGS[@]}" --nproc "$NPROC" \
    --mixed-precision bf16 --rounds "$ROUNDS" --fsdp-rounds "$ROUNDS_FSDP" \
    --script-args "$SCRIPT_ARGS" --fsdp-script-args "$FSDP_SCRIPT_ARGS" \
    --results "$RESULTS" --run-timeout 240 || status=$?
if [ -n "${OUT:-}" ] && [ -f "$RESULTS" ]; then
    cp "$RESULTS" "$OUT/"
fi
exit $status
