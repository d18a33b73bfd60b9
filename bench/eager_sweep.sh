#!/usr/bin/env bash
# sshsdp against a plain eager PyTorch loop on one process (issue 20's single-process table):
# GPT small and base at T = 128 and 256, batches 1, 4 and 8, fp32 (DTYPE=bf16: bf16 weights,
# torch under autocast; where the CPU has bf16 GEMMs), at 1 and 2 threads per process, REPEATS interleaved repeats each (bench/peers/run_fsdp2_peer.sh with PEER=eager
# NP=1, which first checks that the first losses agree). Prints one summary line per
# (threads, model, T, batch): the median [min-max] over repeats of sshsdp / torch tokens/s.
# Benchmark only, never a test; ~30 min on 2 cores with the defaults.
#
#   bench/eager_sweep.sh                  # everything
#   THREADS="1" MODELS="base" SEQS="256" bench/eager_sweep.sh
#   DTYPE=bf16 THREADS=1 bench/eager_sweep.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
THREADS=${THREADS:-1 2}
MODELS=${MODELS:-small base}
SEQS=${SEQS:-128 256}
BATCHES=${BATCHES:-1,4,8}
REPEATS=${REPEATS:-2}
DTYPE=${DTYPE:-fp32}
OUT=${OUT:-$ROOT/out/eager_sweep}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
for th in $THREADS; do
  for m in $MODELS; do
    for t in $SEQS; do
      log="$OUT/t${th}_${m}_T${t}.log"
      echo "== $th thread(s), $m, T=$t, $DTYPE ==" | tee -a "$summary"
      OMP_NUM_THREADS=$th DTYPE=$DTYPE PEER=eager NP=1 MODEL=$m BATCHES=$BATCHES REPEATS=$REPEATS \
        OUT="$OUT/t${th}_${m}_T${t}" EXTRA="--seq-len $t --presets sshsdp" \
        "$ROOT/bench/peers/run_fsdp2_peer.sh" >"$log" 2>&1 || { echo "failed: see $log" | tee -a "$summary"; continue; }
      sed -n '/^== summary/,$p' "$log" | tee -a "$summary"
    done
  done
done
echo "wrote $summary"
