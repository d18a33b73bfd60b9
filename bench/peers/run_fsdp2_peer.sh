#!/usr/bin/env bash
# Side-by-side run of sshsdp and the real PyTorch FSDP2 (fsdp2_peer.py) on the same machine,
# same workloads, same initial weights and token batches. Benchmarks only (never a test).
#
#   bench/peers/run_fsdp2_peer.sh                      # defaults below
#   BATCHES=1,2,4,8 MODEL=small NP=2 bench/peers/run_fsdp2_peer.sh
#   PEER=eager NP=1 MODEL=base EXTRA="--seq-len 256" bench/peers/run_fsdp2_peer.sh
#       one process: sshsdp against a plain eager PyTorch loop (fsdp2_peer.py --eager)
#   PROFILE=1 PEER=eager NP=1 MODEL=base EXTRA="--seq-len 256" bench/peers/run_fsdp2_peer.sh
#       also the step profile of both sides (sshsdp bench --profile, fsdp2_peer.py --profile)
#
# 1. installs torch + numpy from PyPI into a virtual environment on first use, outside the
#    source tree so every clone shares it ($SSHSDP_PEER_VENV, default
#    ${XDG_CACHE_HOME:-~/.cache}/sshsdp/fsdp2-peer; the PyPI wheel bundles CUDA libraries, a
#    few GB; only the CPU path is used);
# 2. fairness check: fp32 weights, 3 steps without warm-up — sshsdp writes the initial
#    weights, batches and its losses, the peer trains the same and must match the first
#    losses within fp32 tolerance (exit 1 otherwise);
# 3. timing in the workload's dtype (DTYPE, default fp32: it runs on every CPU; bf16 where the
#    CPU has bf16 GEMMs), REPEATS times interleaved — `sshsdp bench` over the BATCHES sweep
#    (all presets), then the peer on each workload, then again — each side with its warm-up
#    steps; prints per workload the median over repeats of sshsdp ÷ real-FSDP2 tokens/s and
#    its spread (min–max), next to sshsdp ÷ fsdp2-preset.
# A fairness check whose verdict was written counts, whatever the peer's teardown returns.
# Note: gloo emulates reduce-scatter with all-reduce, so the peer is what a CPU user of FSDP2
# actually gets.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${SSHSDP_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sshsdp/fsdp2-peer}
SSHSDP=${SSHSDP:-$ROOT/build/bin/sshsdp}
NP=${NP:-2}
OUT=${OUT:-$ROOT/out/peer}
MODEL=${MODEL:-small}
BATCHES=${BATCHES:-1,2,4,8}
MICROBATCHES=${MICROBATCHES:-4}
WARMUP=${WARMUP:-2}
STEPS=${STEPS:-5}
DTYPE=${DTYPE:-fp32}
REPEATS=${REPEATS:-3}
CHECK_TOL=${CHECK_TOL:-1e-4}
EXTRA=${EXTRA:-}   # more `sshsdp bench` options, e.g. "--layers 2 --seq-len 64"
PROFILE=${PROFILE:-0}  # 1: step profiles of both sides in the timing runs
BENCH_PROFILE=(); PEER_PROFILE=(); SHOW='^paired|^workload'
if [ "$PROFILE" = 1 ]; then BENCH_PROFILE=(--profile); PEER_PROFILE=(--profile); SHOW='^paired|^workload|^step profile|^config  |^sshsdp |^fsdp2 |^megatron|^vescale'; fi
PEER_MODE=${PEER:-fsdp2}  # fsdp2 | eager (one process: NP=1)
case "$PEER_MODE" in
  fsdp2) PEER_ARGS=() ;;
  eager) PEER_ARGS=(--eager); [ "$NP" = 1 ] || { echo "run_fsdp2_peer.sh: PEER=eager needs NP=1" >&2; exit 2; } ;;
  *) echo "run_fsdp2_peer.sh: PEER must be fsdp2 or eager, got '$PEER_MODE'" >&2; exit 2 ;;
esac

[ -x "$SSHSDP" ] || { echo "run_fsdp2_peer.sh: $SSHSDP not built (scripts/build.sh, or set SSHSDP)" >&2; exit 2; }
if ! "$VENV/bin/python" -c "import torch, numpy" 2>/dev/null; then
  echo "installing torch + numpy into $VENV (first use)"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet torch numpy
fi
threads=$(( $(nproc) / NP )); [ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
# mpirun binds each rank to one core when ranks <= cores: with several threads per rank that
# would put them all on one core (torchrun binds nothing), so bind nothing here either.
BIND=(); [ "$OMP_NUM_THREADS" -gt 1 ] && BIND=(--bind-to none)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 "${BIND[@]}" -x OMP_NUM_THREADS -np "$NP")
TORCHRUN=("$VENV/bin/torchrun" --standalone --nproc_per_node "$NP")
PEER="$ROOT/bench/peers/fsdp2_peer.py"
mkdir -p "$OUT"
first=${BATCHES%%,*}

echo "== fairness check (fp32 weights, batch $first, 3 steps) =="
"${MPIRUN[@]}" "$SSHSDP" bench --model "$MODEL" $EXTRA --batch-size "$first" \
  --microbatches "$MICROBATCHES" --weight-dtype fp32 --presets sshsdp --warmup 0 --steps 3 \
  --peer-inputs "$OUT/check"
"${TORCHRUN[@]}" "$PEER" "${PEER_ARGS[@]}" --inputs "$OUT/check/b$first" --check-steps 3 --check-tol "$CHECK_TOL" \
  --out "$OUT/check/b$first/fsdp2_peer.json" || true
verdict=$(cat "$OUT/check/b$first/fsdp2_peer.json.check" 2>/dev/null || echo '{"passed": false}')
grep -q '"passed": true' <<<"$verdict" || { echo "fairness check failed (or wrote no verdict)" >&2; exit 1; }

echo "== timing ($DTYPE weights, batches $BATCHES, $REPEATS interleaved repeats) =="
for rep in $(seq 1 "$REPEATS"); do
  "${MPIRUN[@]}" "$SSHSDP" bench --model "$MODEL" $EXTRA --batch-size "$BATCHES" \
    --microbatches "$MICROBATCHES" --warmup "$WARMUP" --steps "$STEPS" --weight-dtype "$DTYPE" \
    --peer-inputs "$OUT/timing$rep" --json "$OUT/bench$rep.json" "${BENCH_PROFILE[@]}" | grep -E "$SHOW"
  for b in ${BATCHES//,/ }; do
    "${TORCHRUN[@]}" "$PEER" "${PEER_ARGS[@]}" "${PEER_PROFILE[@]}" --inputs "$OUT/timing$rep/b$b" --out "$OUT/timing$rep/b$b/fsdp2_peer.json"
  done
done
"$VENV/bin/python" - "$OUT" "$BATCHES" "$REPEATS" <<'PY'
import json, statistics, sys
out, batches, reps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
print("\n== summary (tokens/s medians over repeats; ratios: sshsdp over the other, median "
      "[min-max] over repeats) ==")
print(f"{'tokens/mb':>9} {'sshsdp':>9} {'torch peer':>12} {'vs fsdp2 preset':>22} {'vs torch peer':>22}")
for b in batches:
    s_tps, p_tps, r_pre, r_peer = [], [], [], []
    for rep in range(1, reps + 1):
        wl = json.load(open(f"{out}/timing{rep}/b{b}/workload.json"))
        rows = {r["config"]: r for r in wl["rows"]}
        peer = json.load(open(f"{out}/timing{rep}/b{b}/fsdp2_peer.json"))
        s = rows["sshsdp"]["tokens_per_s"]
        s_tps.append(s)
        p_tps.append(peer["tokens_per_s"])
        r_pre.append(1 / rows["fsdp2"]["ratio_to_sshsdp_paired"] if "fsdp2" in rows else float("nan"))
        r_peer.append(s / peer["tokens_per_s"])
    fmt = lambda v: f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
    print(f"{peer['tokens_per_microbatch']:>9} {statistics.median(s_tps):>9.0f} "
          f"{statistics.median(p_tps):>12.0f} {fmt(r_pre):>22} {fmt(r_peer):>22}")
PY
