#!/usr/bin/env bash
# The main job: set up, build, and train the reference GPT on 4 MPI ranks with the paper's
# layout (sw=2, sg=2, so=4: ZeRO-3 pairs, outer ZeRO-1 over all four ranks) on built-in
# synthetic data whose optimal loss is printed, so the loss visibly approaches it.
# Usage: scripts/run.sh [extra `sshsdp train` flags, e.g. --steps 50 --weight-dtype fp32]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_TARGETS=sshsdp scripts/build.sh   # the program only; scripts/test.sh builds the tests
mkdir -p out
RANKS=${RANKS:-4}
CORES=$(nproc)
THREADS=$(( CORES / RANKS )); [ "$THREADS" -ge 1 ] || THREADS=1
# mpirun binds each rank to one core when ranks <= cores: a rank's threads need them all.
BIND=(); [ "$THREADS" -gt 1 ] && BIND=(--bind-to none)
exec mpirun --allow-run-as-root --oversubscribe --mca btl self,vader "${BIND[@]}" \
  --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS="$THREADS" -np "$RANKS" \
  "${BUILD_DIR:-build}/bin/sshsdp" train --model small --sw 2 --sg 2 --so 4 \
  --microbatches 2 --batch-size 4 --steps 300 --warmup 20 --lr 3e-3 --log-every 20 \
  --metrics out/metrics.jsonl --save-weights out/final.safetensors "$@"
