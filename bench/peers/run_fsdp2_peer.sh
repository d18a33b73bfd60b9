#!/usr/bin/env bash
# Side-by-side run of sshsdp and the real PyTorch FSDP2 (fsdp2_peer.py) on the same machine,
# same workloads, same initial weights and token batches. Benchmarks only (never a test).
#
#   bench/peers/run_fsdp2_peer.sh                      # defaults below
#   BATCHES=1,2,4,8 MODEL=small NP=2 bench/peers/run_fsdp2_peer.sh
#
# 1. installs torch + numpy from PyPI into a virtual environment on first use
#    ($SSHSDP_PEER_VENV, default .venv/fsdp2-peer; the PyPI wheel bundles CUDA libraries, a
#    few GB; only the CPU path is used);
# 2. fairness check: fp32 weights, 3 steps without warm-up — sshsdp writes the initial
#    weights, batches and its losses, the peer trains the same and must match the first
#    losses within fp32 tolerance (exit 1 otherwise);
# 3. timing: bf16 runtime weights, `sshsdp bench` over the BATCHES sweep (all presets), then
#    the peer on each workload; prints sshsdp / fsdp2-preset / real-FSDP2 tokens/s and ratios.
# Note: gloo emulates reduce-scatter with all-reduce, so the peer is what a CPU user of FSDP2
# actually gets.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${SSHSDP_PEER_VENV:-$ROOT/.venv/fsdp2-peer}
SSHSDP=${SSHSDP:-$ROOT/build/bin/sshsdp}
NP=${NP:-2}
OUT=${OUT:-$ROOT/out/peer}
MODEL=${MODEL:-small}
BATCHES=${BATCHES:-1,2,4,8}
MICROBATCHES=${MICROBATCHES:-4}
WARMUP=${WARMUP:-2}
STEPS=${STEPS:-5}
CHECK_TOL=${CHECK_TOL:-1e-4}
EXTRA=${EXTRA:-}   # more `sshsdp bench` options, e.g. "--layers 2 --seq-len 64"

[ -x "$SSHSDP" ] || { echo "run_fsdp2_peer.sh: $SSHSDP not built (scripts/build.sh, or set SSHSDP)" >&2; exit 2; }
if ! "$VENV/bin/python" -c "import torch, numpy" 2>/dev/null; then
  echo "installing torch + numpy into $VENV (first use)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet torch numpy
fi
threads=$(( $(nproc) / NP )); [ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS -np "$NP")
TORCHRUN=("$VENV/bin/torchrun" --standalone --nproc_per_node "$NP")
PEER="$ROOT/bench/peers/fsdp2_peer.py"
mkdir -p "$OUT"
first=${BATCHES%%,*}

echo "== fairness check (fp32 weights, batch $first, 3 steps) =="
"${MPIRUN[@]}" "$SSHSDP" bench --model "$MODEL" $EXTRA --batch-size "$first" \
  --microbatches "$MICROBATCHES" --weight-dtype fp32 --presets sshsdp --warmup 0 --steps 3 \
  --peer-inputs "$OUT/check"
"${TORCHRUN[@]}" "$PEER" --inputs "$OUT/check/b$first" --check-steps 3 --check-tol "$CHECK_TOL" \
  --out "$OUT/check/b$first/fsdp2_peer.json"

echo "== timing (bf16 weights, batches $BATCHES) =="
"${MPIRUN[@]}" "$SSHSDP" bench --model "$MODEL" $EXTRA --batch-size "$BATCHES" \
  --microbatches "$MICROBATCHES" --warmup "$WARMUP" --steps "$STEPS" \
  --peer-inputs "$OUT/timing" --json "$OUT/bench.json"
for b in ${BATCHES//,/ }; do
  "${TORCHRUN[@]}" "$PEER" --inputs "$OUT/timing/b$b" --out "$OUT/timing/b$b/fsdp2_peer.json"
done

"$VENV/bin/python" - "$OUT" "$BATCHES" <<'PY'
import json, sys
out, batches = sys.argv[1], sys.argv[2].split(",")
print("\n== summary (tokens/s; ratios are sshsdp over the other) ==")
print(f"{'tokens/mb':>9} {'sshsdp':>9} {'fsdp2 preset':>13} {'torch FSDP2':>12} {'vs preset':>10} {'vs torch':>9}")
for b in batches:
    wl = json.load(open(f"{out}/timing/b{b}/workload.json"))
    rows = {r["config"]: r for r in wl["rows"]}
    peer = json.load(open(f"{out}/timing/b{b}/fsdp2_peer.json"))
    s, f = rows["sshsdp"]["tokens_per_s"], rows.get("fsdp2", {}).get("tokens_per_s", float("nan"))
    print(f"{peer['tokens_per_microbatch']:>9} {s:>9.0f} {f:>13.0f} {peer['tokens_per_s']:>12.0f} "
          f"{s / f:>9.2f}x {s / peer['tokens_per_s']:>8.2f}x")
PY
