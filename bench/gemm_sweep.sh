#!/usr/bin/env bash
# fp32 GEMM providers against torch.mm / torch.bmm (issue 45's table): kernels_gemm_bench over
# the reference models' products on every provider that loads (oneDNN twice: the A/A pair),
# then the torch peer (bench/peers/gemm_torch.py, in the peer venv of run_fsdp2_peer.sh) on the
# same shapes and threads, then the first oneDNN pass again. Prints per product GFLOP/s and
# the ratio of the active provider to torch. Benchmark only, never a test; ~5 min per thread
# count on 2 cores.
#
#   bench/gemm_sweep.sh                  # 1 and 2 threads
#   THREADS=1 REPS=5 bench/gemm_sweep.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SSHSDP_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sshsdp/fsdp2-peer}
BENCH=${BENCH:-$ROOT/build/sshsdp/kernels/kernels_gemm_bench}
THREADS=${THREADS:-1 2}
REPS=${REPS:-3}
OUT=${OUT:-$ROOT/out/gemm_sweep}
mkdir -p "$OUT"
[ -x "$BENCH" ] || { echo "gemm_sweep: build first (scripts/build.sh): $BENCH" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || { echo "gemm_sweep: no torch venv at $VENV (bench/peers/run_fsdp2_peer.sh makes it)" >&2; exit 1; }
"$BENCH" --shapes >"$OUT/shapes.jsonl"
env -u SSHSDP_GEMM "$BENCH" --auto >"$OUT/auto.txt"
cat "$OUT/auto.txt"
for th in $THREADS; do
  raw="$OUT/t$th.jsonl"
  OMP_NUM_THREADS=$th "$BENCH" --json --reps "$REPS" >"$raw"
  OMP_NUM_THREADS=$th "$VENV/bin/python" "$ROOT/bench/peers/gemm_torch.py" "$REPS" \
    <"$OUT/shapes.jsonl" >>"$raw"
done
python3 - "$OUT" $THREADS <<'PY'
import json, sys, collections
out, threads = sys.argv[1], sys.argv[2:]
auto = open(f"{out}/auto.txt").read().split()[0]
for th in threads:
    rows = collections.OrderedDict()
    for line in open(f"{out}/t{th}.jsonl"):
        r = json.loads(line)
        key = r["provider"] + ("'" if r["repeat"] else "")
        rows.setdefault(r["name"], {})[key] = r["gflops"]
    cols = [c for c in ["torch", "onednn", "mkl", "blis", "onednn'"] if any(c in v for v in rows.values())]
    print(f"== {th} thread(s), fp32 GFLOP/s; auto = {auto}; A/A = onednn'/onednn")
    print(f"{'product':<22}" + "".join(f"{c:>9}" for c in cols) +
          f"{'auto/torch':>11}{'best/torch':>11}{'A/A':>6}")
    for name, v in rows.items():
        best = max(v.get(c, 0) for c in ["onednn", "mkl", "blis"])
        aa = v.get("onednn'", 0) / v["onednn"] if v.get("onednn") else 0
        print(f"{name:<22}" + "".join(f"{v.get(c, 0):9.1f}" for c in cols) +
              f"{v.get(auto, 0) / v['torch']:11.2f}{best / v['torch']:11.2f}{aa:6.2f}")
PY
