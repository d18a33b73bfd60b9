#!/usr/bin/env bash
# sshsdp against transformers' own Qwen3 and Qwen3-MoE models (bench/peers/hf_peer.py): eager
# PyTorch on one process, and FSDP2 (fully_shard per decoder layer, gloo) on 2 ranks, on the
# same config.json (bench/configs/qwen3_bench.json, qwen3_moe_bench.json), fp32 and bf16
# (torch.autocast over fp32 weights; sshsdp's bf16 runtime weights over fp32 main weights),
# AdamW, at several batch shapes. One process gets every core's thread, two ranks one each.
# Prints tokens/s of each and the ratios sshsdp / eager and sshsdp / FSDP2; the A/A line runs
# sshsdp twice on the same cell (the noise floor). Benchmark only, never a test.
#
#   bench/hf_sweep.sh
#   CONFIGS=qwen3_moe_bench DTYPES=bf16 SHAPES="4x256" bench/hf_sweep.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/build/bin/sshsdp}
VENV=${SSHSDP_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sshsdp/fsdp2-peer}
CONFIGS=${CONFIGS:-qwen3_bench qwen3_moe_bench}
DTYPES=${DTYPES:-fp32 bf16}
SHAPES=${SHAPES:-1x256 4x128 4x256 8x256}
STEPS=${STEPS:-6}
CORES=${CORES:-$(nproc)}
OUT=${OUT:-$ROOT/out/hf_sweep}
MPIRUN=${MPIRUN:-mpirun --oversubscribe --bind-to none}
mkdir -p "$OUT"
"$VENV/bin/python" -c "import torch, transformers" || {
  echo "no torch + transformers in $VENV (bench/peers/run_fsdp2_peer.sh makes the venv)"
  exit 1
}

# sshsdp NP B T DTYPE CONFIG: tokens/s over all ranks (median step after 2 warm-up steps).
sshsdp() {
  local np=$1 b=$2 t=$3 dt=$4 cfg=$5 m="$OUT/m.jsonl"
  rm -f "$m"
  OMP_NUM_THREADS=$((CORES / np)) $MPIRUN -np "$np" "$BIN" train --model-config "$cfg" \
    --seq-len "$t" --batch-size "$b" --steps $((STEPS + 2)) --weight-dtype "$dt" \
    --log-every 100 --metrics "$m" >"$OUT/sshsdp.log" 2>&1
  python3 - "$m" "$np" "$b" "$t" <<'PY'
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])][2:]
np_, b, t = map(int, sys.argv[2:5])
print(f"{np_ * b * t / statistics.median(x['step_seconds'] for x in r):.0f}")
PY
}

# torch NP B T DTYPE CONFIG
torch_peer() {
  local np=$1 b=$2 t=$3 dt=$4 cfg=$5 args
  args=(--config "$cfg" --seq-len "$t" --batch-size "$b" --steps "$STEPS" --dtype "$dt")
  if [ "$np" = 1 ]; then
    OMP_NUM_THREADS=$CORES "$VENV/bin/python" "$ROOT/bench/peers/hf_peer.py" "${args[@]}"
  else
    OMP_NUM_THREADS=$((CORES / np)) "$VENV/bin/torchrun" --standalone --nproc_per_node "$np" \
      "$ROOT/bench/peers/hf_peer.py" --fsdp2 "${args[@]}"
  fi 2>"$OUT/torch.log" | python3 -c "import json,sys; print(f\"{json.loads(sys.stdin.readlines()[-1])['tokens_per_s']:.0f}\")"
}

ratio() { python3 -c "print($1 / $2)"; }

summary="$OUT/summary.txt"
{
  echo "# $(date -u +%F) | $(lscpu | sed -n 's/^Model name: *//p') | $CORES cores | $("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
  printf "%-16s %-5s %-6s %9s %9s %7s %9s %9s %7s\n" config dtype BxT sshsdp1 eager ratio sshsdp2 fsdp2 ratio
} | tee "$summary"
for c in $CONFIGS; do
  cfg="$ROOT/bench/configs/$c.json"
  for dt in $DTYPES; do
    for s in $SHAPES; do
      b=${s%x*} t=${s#*x}
      s1=$(sshsdp 1 "$b" "$t" "$dt" "$cfg") e1=$(torch_peer 1 "$b" "$t" "$dt" "$cfg")
      s2=$(sshsdp 2 "$b" "$t" "$dt" "$cfg") f2=$(torch_peer 2 "$b" "$t" "$dt" "$cfg")
      printf "%-16s %-5s %-6s %9s %9s %7.2f %9s %9s %7.2f\n" "$c" "$dt" "$s" "$s1" "$e1" \
        "$(ratio "$s1" "$e1")" "$s2" "$f2" "$(ratio "$s2" "$f2")" | tee -a "$summary"
    done
  done
  a=$(sshsdp 1 4 256 fp32 "$cfg") b2=$(sshsdp 1 4 256 fp32 "$cfg")
  printf "A/A %-12s fp32  4x256  sshsdp1 twice: %s %s (%.3f)\n" "$c" "$a" "$b2" \
    "$(ratio "$a" "$b2")" | tee -a "$summary"
done
echo "wrote $summary"
