#!/usr/bin/env bash
# The direct (ZeroSM) path against the collective path, like the paper's Figure 8 (§6.2), at
# our scale: one job per part, every configuration in the same job so load changes hit all.
#
#   1. direct_bench: per-microbatch all-gather and reduce-scatter alone, ring vs direct, over
#      per-rank shard sizes and 1 / 2 / 4 simulated nodes (medians, job-wide inter-node bytes).
#   2. sshsdp bench: training steps of fsdp2 (collective), sshsdp (collective, the paper's
#      "SM-based") and sshsdp+direct ("ZeroSM") round-robin, over per-rank workload sizes
#      (tokens per microbatch per rank = batch x seq), sharding degree = world, 2 simulated
#      nodes; throughput ratios against the sshsdp row (JSON: every row, every counter).
#
#   bench/zerosm_fig8.sh                                 # 4 ranks, out/zerosm
#   RANKS=8 NODES=2 BATCHES=1,4,16,64 OUT=/tmp/z BUILD_DIR=build-zerosm bench/zerosm_fig8.sh
#
# Extra arguments go to `sshsdp bench` (e.g. --model small --layers 4).
set -euo pipefail
RANKS=${RANKS:-4}
NODES=${NODES:-2}
BATCHES=${BATCHES:-1,4,16,64}
STEPS=${STEPS:-7}
OUT=${OUT:-out/zerosm}
BUILD=${BUILD_DIR:-build}
THREADS=$(( $(nproc) / RANKS )); [ "$THREADS" -ge 1 ] || THREADS=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1
        -x OMP_NUM_THREADS="$THREADS" -np "$RANKS")
mkdir -p "$OUT"
"${MPIRUN[@]}" "$BUILD/sshsdp/comm/direct_bench" --min-bytes 4K --max-bytes 4M --nodes 1,2,4 \
  --iters 30 --warmup 5 --json "$OUT/direct_bench.json" | tee "$OUT/direct_bench.txt"
"${MPIRUN[@]}" "$BUILD/bin/sshsdp" bench --model tiny --layers 4 --d-model 128 --heads 4 \
  --seq-len 64 --presets fsdp2,sshsdp --comm-path collective,direct \
  --ranks-per-node $(( RANKS / NODES )) --batch-size "$BATCHES" --microbatches 4 --warmup 2 \
  --steps "$STEPS" --json "$OUT/engine.json" "$@" | tee "$OUT/engine.txt"
