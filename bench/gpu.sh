#!/usr/bin/env bash
# One prepared run for a lent GPU (H100/H200 class), under 10 minutes in all:
#   1. the CUDA tests (FlexAttention compiled vs SDPA, fp32 and bf16; blocks compiled vs eager for every
#      attention backend, forward and backward; bf16 training step; KV decoding),
#   2. bench/register_attention.py (the registers' attention alone, two ways), bench/train_step.py at full GPT-B depth and per-GPU batch (128 = 1024 / 8 GPUs), bf16
#      autocast, FlexAttention vs SDPA split; MFU of the NTP step with compiled blocks (against the
#      measured bf16 matmul rate and the nominal peak); one profiled step per case (its slowest kernels),
#   3. bench/sample.py at full GPT-B depth (images/s at cfg 2.0, KV cache vs recompute), eager and captured
#      (CUDA graph), then compiled,
#   4. the sharded (FSDP2) path on the GPU: torchrun with one process (a one-rank mesh), bf16 mixed
#      precision policy, sharded .dcp checkpoints, --resume auto from one (digits, tiny model).
# Each step has its own time limit, so one slow step cannot eat the others' time.
# Results: one JSON file per benchmark (and the logs) under $OUT (default bench/out/).
#
#   bash bench/gpu.sh                      # PEAK_TFLOPS=989 (H100/H200 SXM bf16 dense) by default
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/out}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
export MUTOR2D_PEAK_TFLOPS=$PEAK_TFLOPS     # the MFU that training logs uses the same peak
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" \
    | tee -a "$OUT/gpu.txt" || exit 1

step() {  # step NAME SECONDS CMD...: run with a time limit, keep the log and the last (JSON) line
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2> "$OUT/$name.err"
    local rc=$?
    [ "$name" = cuda_tests ] || tail -n 1 "$OUT/$name.log" > "$OUT/$name.json"
    echo "$name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}

step cuda_tests 100 $PY -m pytest -q -p no:cacheprovider tests/test_bench.py tests/test_compile.py \
    tests/test_registers.py tests/test_gpu_path.py tests/test_captured.py -k cuda
step train_step 100 $PY bench/train_step.py --device cuda --dtype bf16 --layers 12 --mfu-layers 12 \
    --batch 128 --reps 5 --backends flex,sdpa --compile mfu --peak-tflops "$PEAK_TFLOPS" --profile 12
# the registers' attention alone, fwd + bwd: the masked SDPA split against a log-sum-exp merge over body keys
step register_attention 40 $PY bench/register_attention.py --device cuda --batch 32 --reps 10
# eager and compiled sampling apart: compiling the decode step costs about 25 s plus 6.5 s per layer on an
# H200 (measured at 1 and 2 layers, 2026-12-04), so about 100 s at GPT-B depth, once per model: the
# compiled run times the 12-layer throughput only (--step-layers 0; the eager run has the step) and logs
# its recompiles
# the eager run also times the plain rounds replayed as a CUDA graph (sample.py's default on CUDA), side by side
step sample 150 $PY bench/sample.py --device cuda --layers 12 --step-layers 12 --images 32 --reps 3 --compile off \
    --capture on
TORCH_LOGS=recompiles step sample_compiled 210 $PY bench/sample.py --device cuda --layers 12 --step-layers 0 \
    --images 32 --reps 3 --compile on --capture off
FSDP_RUN="$OUT/fsdp_run"; rm -rf "$FSDP_RUN"
FSDP="$PY -m torch.distributed.run --nproc_per_node 1 train.py --config digits_mutor2d.yaml --out $FSDP_RUN \
  --set train.sharding=fsdp --set train.mixed_precision=bf16 --set train.ckpt_every=3 --set train.tracker=none"
step fsdp 50 bash -c "$FSDP --max-steps 3 && $FSDP --max-steps 6 --resume auto && ls $FSDP_RUN/checkpoints"
cat "$OUT/summary.txt"
