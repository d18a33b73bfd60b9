#!/usr/bin/env bash
# The README's baseline comparison, re-measurable in one command: every preset of the one
# engine on GPT small and moe-small, 2 ranks (fully sharded), 4 microbatches, 4 workload sizes
# (128-1024 tokens per microbatch per rank), in both preset orders, plus an A/A run
# (sshsdp against itself: the noise floor), each in one job with round-robin timed steps.
# Then bench/summarize_sweep.py prints the Markdown tables (paired ratios sshsdp ÷ preset,
# both orders; time split) with the CPU, dtype and date.
#
#   bench/baselines_sweep.sh                       # fp32 weights, out/sweep
#   DTYPE=bf16 OUT=out/sweep-bf16 bench/baselines_sweep.sh
#
# Run it on an otherwise idle machine: the ratios are only as good as the A/A floor.
set -euo pipefail
DTYPE=${DTYPE:-fp32}
OUT=${OUT:-out/sweep}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
BATCHES=${BATCHES:-1,2,4,8}
BUILD=${BUILD_DIR:-build}
MODELS=${MODELS:-small moe-small}
mkdir -p "$OUT"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1
        -x OMP_NUM_THREADS=1 -np 2)
all=sshsdp,fsdp2,megatron-fsdp,vescale-fsdp
rev=vescale-fsdp,megatron-fsdp,fsdp2,sshsdp
for model in $MODELS; do
  for run in "forward:$all" "reverse:$rev" "aa:sshsdp,sshsdp"; do
    tag=${run%%:*}
    presets=${run#*:}
    echo "== $model $DTYPE $tag ($presets)"
    "${MPIRUN[@]}" "$BUILD/bin/sshsdp" bench --model "$model" --seq-len 128 --microbatches 4 \
      --batch-size "$BATCHES" --weight-dtype "$DTYPE" --warmup "$WARMUP" --steps "$STEPS" \
      --presets "$presets" --json "$OUT/$model-$DTYPE-$tag.json" "$@" |
      tee "$OUT/$model-$DTYPE-$tag.txt" | grep -E "^paired|^workload"
  done
done
python3 "$(dirname "$0")/summarize_sweep.py" "$OUT" | tee "$OUT/summary.md"
