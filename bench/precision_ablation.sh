#!/usr/bin/env bash
# Precision ablation like the paper's Figure 7 (§6.1), at our scale: the three gradient
# reduction modes (fp32, bf16+fp32, bf16sr) from the same seed, data and optimizer settings,
# trained one after the other; only --reduce changes. Writes every step's loss of every mode to
# one CSV (step,fp32,bf16+fp32,bf16sr,diff_bf16+fp32,diff_bf16sr) that any plotting tool reads,
# and prints the final-window mean-loss differences against fp32.
#
#   bench/precision_ablation.sh                 # 2 ranks, tiny, 300 steps, out/ablation
#   STEPS=100 RANKS=3 MODEL=tiny OUT=/tmp/abl BUILD_DIR=build-mx bench/precision_ablation.sh
#
# The paper rounds each node-local partial sum once: the default COMM_PATH=direct runs the
# direct path, whose reduce-scatter sums a node's gradients in fp32 and (bf16sr) stores that
# node partial as bf16 with stochastic rounding, once, before the inter-node exchange —
# with NODES simulated nodes (default 3: one rank per node, so every rank's contribution is a
# rounded node partial). COMM_PATH=collective measures something else: the ring rounds the
# running partial at every hop (ZeRO-2 groups of >= 3 ranks; a 2-rank ring sums the two bf16
# inputs in fp32 directly). Extra arguments go to `sshsdp train`.
set -euo pipefail
RANKS=${RANKS:-3}
STEPS=${STEPS:-300}
MODEL=${MODEL:-tiny}
OUT=${OUT:-out/ablation}
WINDOW=${WINDOW:-50}
COMM_PATH=${COMM_PATH:-direct}
NODES=${NODES:-$RANKS}
BIN=${BUILD_DIR:-build}/bin/sshsdp
THREADS=$(( $(nproc) / RANKS )); [ "$THREADS" -ge 1 ] || THREADS=1
mkdir -p "$OUT"
for mode in fp32 bf16+fp32 bf16sr; do
  tag=${mode/+/_}
  mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1 \
    -x OMP_NUM_THREADS="$THREADS" -np "$RANKS" "$BIN" train --model "$MODEL" \
    --sw "$RANKS" --sg "$RANKS" --so "$RANKS" --microbatches 2 --batch-size 4 \
    --steps "$STEPS" --warmup 20 --lr 3e-3 --seed 1 --sr-seed 7 --log-every 50 \
    --reduce "$mode" --comm-path "$COMM_PATH" --ranks-per-node $(( RANKS / NODES )) --metrics "$OUT/$tag.jsonl" "$@" | tail -n 2
done
python3 - "$OUT" "$WINDOW" <<'PY'
import json, sys
out, window = sys.argv[1], int(sys.argv[2])
modes = ["fp32", "bf16+fp32", "bf16sr"]
loss = {m: [json.loads(l)["loss"] for l in open(f"{out}/{m.replace('+', '_')}.jsonl")] for m in modes}
n = min(len(v) for v in loss.values())
with open(f"{out}/precision_ablation.csv", "w") as f:
    f.write("step,fp32,bf16+fp32,bf16sr,diff_bf16+fp32,diff_bf16sr\n")
    for i in range(n):
        a, b, c = (loss[m][i] for m in modes)
        f.write(f"{i + 1},{a:.6f},{b:.6f},{c:.6f},{b - a:.6e},{c - a:.6e}\n")
w = min(window, n)
mean = {m: sum(loss[m][n - w:n]) / w for m in modes}
print(f"steps {n}, final-{w}-step mean loss: " +
      ", ".join(f"{m} {mean[m]:.5f}" for m in modes))
for m in modes[1:]:
    d = mean[m] - mean["fp32"]
    print(f"  {m:>10} - fp32 = {d:+.3e} ({100 * d / mean['fp32']:+.3f}%)")
print(f"curves: {out}/precision_ablation.csv")
PY
