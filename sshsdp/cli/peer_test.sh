#!/usr/bin/env bash
# The PyTorch peers (bench/peers/fsdp2_peer.py) train the same model as sshsdp: for the dense
# GPT and the MoE GPT, `sshsdp bench --peer-inputs` writes the initial weights, batches and
# workload, and the peer must reproduce sshsdp's first three step losses in fp32 within 1e-4
# relative — eager on one process, FSDP2 over gloo on two. Without torch (the peers' virtual
# environment, made on first use by bench/peers/run_fsdp2_peer.sh) this test reports skipped
# (exit 77), never passed. Nothing here is timed.
# Usage: peer_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${SSHSDP_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sshsdp/fsdp2-peer}
if ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
  echo "skipped: no torch in $venv (bench/peers/run_fsdp2_peer.sh installs it on first use)"
  exit 77
fi
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"

# peer_check NAME NP PEER_ARGS -- BENCH_ARGS...: sshsdp bench writes the inputs, the peer checks.
peer_check() {
  local name=$1 np=$2 peer_args=$3
  shift 4
  local dir="$tmp/$name"
  timeout 180 "${mpirun[@]}" -np "$np" "$bin" bench "$@" --batch-size 2 --microbatches 2 \
    --weight-dtype fp32 --presets sshsdp --warmup 0 --steps 3 --peer-inputs "$dir" \
    >"$tmp/out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/out" | tail -20
  check "$name: sshsdp bench writes the peer inputs" $rc
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 timeout 300 "$venv/bin/torchrun" --standalone --nproc_per_node "$np" \
    "$root/bench/peers/fsdp2_peer.py" $peer_args --inputs "$dir/b2" --check-steps 3 \
    --check-tol 1e-4 --out "$dir/peer.json" >"$tmp/out" 2>&1
  grep -q '"passed": true' "$dir/peer.json.check" 2>/dev/null
  rc=$?
  [ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/out" | tail -20
  check "$name: the peer's first 3 losses equal sshsdp's within 1e-4" $rc
}

tiny=(--model tiny --layers 2 --seq-len 32)
moe=(--model moe-tiny --seq-len 32)
peer_check dense-eager 1 --eager -- "${tiny[@]}"
peer_check moe-eager 1 --eager -- "${moe[@]}"
peer_check moe-fsdp2 2 "" -- "${moe[@]}"

# The MoE workload describes the MoE model the peer builds (type, experts, routing, aux loss).
python3 - "$tmp/moe-eager/b2/workload.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["model"]
assert m["type"] == "moe-gpt" and m["n_expert"] == 4 and m["top_k"] == 2, m
assert m["moe_layers"] == [0, 1] and m["aux_loss_weight"] > 0 and m["gating"] == "softmax", m
PY
check "the MoE workload names the MoE model" $?
finish_checks
