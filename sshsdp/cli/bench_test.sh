#!/usr/bin/env bash
# Smoke test of `sshsdp bench` (a benchmark is never a timed test: nothing here asserts a
# speed): one tiny workload sweep of every preset and the ablation ladder on 2 ranks must
# finish, print both step counts, write JSON rows whose copy counters say what each preset
# pays (sshsdp and vescale-fsdp's per-part GEMMs: zero bytes copied; fsdp2: weight and gradient
# copies and add passes), and an unknown preset must fail fast naming the presets.
# Usage: bench_test.sh SSHSDP MPIRUN [MPIRUN_ARGS...]
set -u
bin=$1
shift
mpirun=("$@")
# shellcheck source=testing/check.sh
. "$(dirname "$0")/testing/check.sh"
small=(--model tiny --layers 1 --seq-len 16 --microbatches 2 --warmup 1 --steps 2)

timeout 120 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1,2 \
  --json "$tmp/bench.json" --peer-inputs "$tmp/peer" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/out" | tail -20
check "bench runs every preset on a 2-workload sweep" $rc
grep -q "1 warm-up + 2 timed steps" "$tmp/out"; check "bench states warm-up and timed steps" $?

# The Llama family from a Hugging Face config.json (a Qwen3-MoE): every preset and baseline
# switch runs it, with first-step losses that agree.
root=$(cd "$(dirname "$0")/../.." && pwd)
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench --model-config \
  "$root/sshsdp/hf/testdata/qwen3_moe/config.json" --seq-len 16 --microbatches 1 --warmup 1 \
  --steps 1 --batch-size 1 --json "$tmp/hf.json" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/out" | tail -20
check "bench runs every preset on a Qwen3-MoE config.json" $rc
python3 - "$tmp/hf.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert {r["config"] for r in rows} >= {"sshsdp", "fsdp2", "megatron-fsdp", "vescale-fsdp"}, \
    [r["config"] for r in rows]
first = [r["losses"][0] for r in rows]
assert max(first) - min(first) <= 1e-5 * max(first), first
PY
check "every preset's first loss on the Qwen3-MoE agrees" $?
python3 - "$tmp/bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 8, len(rows)
by = {(r["batch_size"], r["config"]): r for r in rows}
# Every row names the GEMM path of its bf16 weights and the peak its MFU is against.
for r in rows:
    assert r["gemm_path"].startswith(("bf16 native", "bf16 widened to fp32")), r["gemm_path"]
    assert r["gemm_peak_flops"] > 0 and r["gemm_peak_pinned"] is False, r
for b in (1, 2):
    s, f, m = by[(b, "sshsdp")], by[(b, "fsdp2")], by[(b, "megatron-fsdp")]
    assert s["bytes_copied_per_step"] == 0 and s["add_passes"] == 0, s
    assert f["bytes_copied_weights"] > 0 and f["bytes_copied_grads"] > 0, f
    assert f["add_passes"] > 0 and m["add_passes"] > 0 and m["bytes_copied_per_step"] == 0
    assert abs(s["ratio_to_sshsdp"] - 1) < 1e-12 and s["tokens_per_s"] > 0
    # Paired ratios: each row's per-round step ratio against the sshsdp row, named.
    assert s["ratio_to_sshsdp_paired"] == 1 and s["ratio_reference"] == "sshsdp", s
    assert f["ratio_to_sshsdp_paired"] > 0 and f["ratio_reference"] == "sshsdp", f
    # vescale-fsdp: no packed runtime layout, so no ① and no copies.
    v = by[(b, "vescale-fsdp")]
    assert v["redundancies"] == "②⑤⑦" and v["bytes_copied_per_step"] == 0, v
    # AdamW: every framework's model is the one its users write, one fused QKV parameter, so
    # FSDP2 packs nothing per use (①: 0 bytes) though its switch is on.
    for r in (s, f, m, v):
        assert r["qkv_model"] == "fused QKV", r
    assert f["redundancies"] == "①②③④⑤⑥⑦" and f["copies"]["weight_pack"] == 0, f
    # Copies inside collectives are counted for every row alike: sshsdp's and Megatron's
    # out-of-place gathers copy the own shard; FSDP2 / veScale write it first and gather in place.
    assert s["collective_copy_bytes_per_step"] > 0 and m["collective_copy_bytes_per_step"] > 0
    assert f["collective_copy_bytes_per_step"] == 0 and v["collective_copy_bytes_per_step"] == 0
    l0 = s["losses"][0]
    for r in (f, m, v):
        assert abs(r["losses"][0] - l0) < 1e-3 * l0, (r["config"], r["losses"][0], l0)
PY
check "JSON rows carry the counters and agreeing losses" $?
"$(dirname "$0")/../../scripts/plot_metrics.py" --bench "$tmp/bench.json" "$tmp/bench.png" >/dev/null &&
  [ "$(head -c 4 "$tmp/bench.png" | od -An -c | tr -d ' ')" = "211PNG" ]
check "plot_metrics.py --bench draws the sweep as a PNG" $?
[ -s "$tmp/peer/b1/init.safetensors" ] && [ -s "$tmp/peer/b2/batches.bin" ] && [ -s "$tmp/peer/b1/workload.json" ]
check "peer inputs written per workload" $?

timeout 120 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1 --ablation \
  --json "$tmp/ablation.json" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && python3 -c "
import json,sys; r=json.load(open('$tmp/ablation.json'))
assert r[0]['config']=='fsdp2' and r[-1]['redundancies']=='none' and r[-1]['bytes_copied_per_step']==0
assert r[-1]['ratio_to_sshsdp']==1 and all(x['ratio_reference']==r[-1]['config'] for x in r), r
" || rc=1
check "ablation ladder runs from fsdp2 to sshsdp (ratios against its last rung)" $rc

timeout 120 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1 --sequential \
  --presets fsdp2,sshsdp --json "$tmp/seq.json" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && python3 -c "
import json; r=json.load(open('$tmp/seq.json'))
assert [x['ratio_reference'] for x in r]==['sshsdp','sshsdp'] and r[1]['ratio_to_sshsdp']==1, r
assert all(x['ratio_to_sshsdp_paired'] is None for x in r), r   # nothing paired back to back
" || rc=1
check "--sequential: ratios against sshsdp, no paired ratios claimed" $rc

# --profile: the step profile table, and JSON shares that add up to the step: the model's
# kernels by category inside compute, the engine's categories around it; the MoE model too,
# with its routing (gating, permutation, combination) as a category of its own.
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1 --presets sshsdp,fsdp2 \
  --profile --json "$tmp/prof.json" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "^step profile" "$tmp/out" && python3 -c "
import json; r=json.load(open('$tmp/prof.json'))
for x in r:
    p=x['profile']; s=p['seconds']
    assert p['profiled'] and s['gemm'] > 0 and s['attention'] > 0 and s['norm'] > 0, p
    kernels = sum(v for k, v in s.items() if k not in ('compute other', 'comm wait', 'copy+cast+add', 'optimizer', 'other'))
    assert 0 < kernels <= x['time_s']['compute'] * (1 + 1e-9), x      # scopes nest in compute
    assert s['compute other'] >= -1e-9 and s['other'] >= -1e-9, p
    assert s['optimizer'] == x['time_s']['optimizer'] and s['comm wait'] == x['time_s']['comm_wait'], x
" || rc=1
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/out" | tail -20
check "--profile: kernel categories add up to compute, all categories to the step" $rc
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench --model moe-tiny --layers 2 --seq-len 16 --microbatches 2 \
  --warmup 1 --steps 1 --batch-size 1 --presets sshsdp,fsdp2 --profile --json "$tmp/moeprof.json" \
  >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && python3 -c "
import json; r=json.load(open('$tmp/moeprof.json'))
for x in r:
    p=x['profile']; s=p['seconds']
    assert p['profiled'] and all(s[k] > 0 for k in ('gemm', 'attention', 'norm', 'activation', 'loss', 'routing')), p
    kernels = sum(v for k, v in s.items() if k not in ('compute other', 'comm wait', 'copy+cast+add', 'optimizer', 'other'))
    assert 0 < kernels <= x['time_s']['compute'] * (1 + 1e-9), x
" || rc=1
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/out" | tail -20
check "--profile on the MoE model: its kernels and routing inside compute" $rc

# Threads bound to fewer CPUs: one rank of 2 threads bound to one core is warned about, with
# the launch that fixes it; unbound on a machine with 2+ CPUs it is not.
OMP_NUM_THREADS=2 timeout 60 "${mpirun[@]}" --bind-to core -x OMP_NUM_THREADS -np 1 "$bin" bench \
  "${small[@]}" --batch-size 1 --presets sshsdp --steps 1 >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "warning: 2 kernel threads (OMP_NUM_THREADS) share 1 CPU .*--bind-to none" "$tmp/out"
check "2 threads bound to one core: warned, naming --bind-to none" $?
if [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ]; then  # (nproc would honour OMP_NUM_THREADS)
  OMP_NUM_THREADS=2 timeout 60 "${mpirun[@]}" --bind-to none -x OMP_NUM_THREADS -np 1 "$bin" bench \
    "${small[@]}" --batch-size 1 --presets sshsdp --steps 1 >"$tmp/out" 2>&1
  rc=$?
  [ $rc -eq 0 ] && ! grep -q "kernel threads" "$tmp/out"
  check "2 threads unbound on 2+ CPUs: no warning" $?
fi

# Without OMP_NUM_THREADS, unbound ranks share the node's CPUs (OpenMP's default would give
# each of them every CPU: ~20x slower with 4 ranks on 2 CPUs); with OMP_NUM_THREADS at the
# CPU count on 2 unbound ranks, the node is oversubscribed and that is warned about.
cpus=$(getconf _NPROCESSORS_ONLN)
share=$((cpus / 3 > 0 ? cpus / 3 : 1))
env -u OMP_NUM_THREADS timeout 120 "${mpirun[@]}" --bind-to none -np 3 "$bin" bench \
  "${small[@]}" --batch-size 1 --presets sshsdp --steps 1 >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "threads $share per rank (OMP_NUM_THREADS unset: 3 ranks on this node share $cpus CPU" "$tmp/out" &&
  ! grep -q "warning" "$tmp/out"
check "OMP_NUM_THREADS unset, 3 unbound ranks: $share thread(s) each, no warning" $?
OMP_NUM_THREADS=$cpus timeout 120 "${mpirun[@]}" --bind-to none -x OMP_NUM_THREADS -np 2 "$bin" \
  bench "${small[@]}" --batch-size 1 --presets sshsdp --steps 1 >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "warning: 2 ranks on this node × $cpus kernel threads (OMP_NUM_THREADS) share $cpus CPU.*take turns" "$tmp/out"
check "OMP_NUM_THREADS=$cpus on 2 unbound ranks: warned that they take turns" $?

# Unset degrees resolve as in train: --so 1 alone is DDP (sg and sw follow so).
timeout 60 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1 --presets sshsdp \
  --so 1 --steps 1 >"$tmp/out" 2>&1 && grep -q "W=2 nodes=1x2 sw=1 sg=1 so=1 " "$tmp/out"
check "bench --so 1 on 2 ranks: sw = sg = so = 1, as train resolves it" $?
# The outer phase both ways (DDP layout at W = 2: every gradient is all-reduced across the two
# replicas): overlapped rows count one outer reduction per group, the /outer-sync rows none;
# same first losses (bench checks that across rows).
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1 --sw 1 --sg 1 --so 1 \
  --presets sshsdp,fsdp2 --overlap-outer on,off --json "$tmp/outer.json" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && python3 -c "
import json; r=json.load(open('$tmp/outer.json'))
assert [x['config'] for x in r]==['sshsdp','sshsdp/outer-sync','fsdp2','fsdp2/outer-sync'], r
n=[x['update']['outer_overlapped'] for x in r]
assert n[0]>0 and n[2]==n[0] and n[1]==0 and n[3]==0, n
" || rc=1
check "--overlap-outer on,off: overlapped rows count outer reductions, sync rows none" $rc
timeout 60 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --overlap-outer maybe >"$tmp/out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "overlap-outer values must be on or off, got 'maybe'" "$tmp/out"
check "bench refuses a bad --overlap-outer, naming it" $?

timeout 60 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --weight-dtype e4m3 >"$tmp/out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "bench compares presets with bf16 or fp32 weights, got 'e4m3'" "$tmp/out"
check "bench refuses a weight dtype it cannot compare, naming it" $?

# Muon (⑥): sshsdp's point-to-point units vs fsdp2's full_tensor, exact update counters in the
# JSON (fsdp2: all-gathers and every unit's Newton–Schulz FLOPs on each rank = 2x sshsdp's
# balanced share in total; sshsdp: p2p only), the ablation ladder with Muon on every rung, and
# megatron-fsdp named and refused.
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1 --optimizer muon \
  --presets sshsdp,fsdp2 --json "$tmp/muon.json" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || sed 's/^/  | /' "$tmp/out" | tail -20
[ $rc -eq 0 ] && grep -q "update phase (Muon per head" "$tmp/out" && python3 -c "
import json; r={x['config']: x for x in json.load(open('$tmp/muon.json'))}
s, f = r['sshsdp']['update'], r['fsdp2']['update']
assert s['full_tensor_bytes'] == 0 and s['p2p_bytes'] > 0, s
assert f['p2p_bytes'] == 0 and f['full_tensor_bytes'] > 0 and f['full_tensor_calls'] > 0, f
assert f['ns_flops_per_rank'] > s['ns_flops_per_rank'] > 0, (s, f)
assert abs(r['fsdp2']['losses'][0] - r['sshsdp']['losses'][0]) < 1e-3 * r['sshsdp']['losses'][0]
# Per-head Muon needs per-head parameters: FSDP2's users torch.cat them on every use (①).
assert r['fsdp2']['qkv_model'] == r['sshsdp']['qkv_model'] == 'packed per-head QKV', r
assert r['fsdp2']['copies']['weight_pack'] > 0 and r['sshsdp']['bytes_copied_per_step'] == 0
" || rc=1
check "Muon: sshsdp p2p units vs fsdp2 full_tensor, update counters in JSON" $rc
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --batch-size 1 --optimizer muon \
  --ablation >"$tmp/out" 2>&1
check "Muon: the ablation ladder runs every rung" $?
timeout 60 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --optimizer muon \
  --presets megatron-fsdp >"$tmp/out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "megatron-fsdp" "$tmp/out"
check "Muon: megatron-fsdp refused, named" $?

timeout 60 "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --presets deepspeed >"$tmp/out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "megatron-fsdp" "$tmp/out"
check "unknown preset fails naming the presets" $?
expect_error "--comm-path nccl is refused by name (bench runs on the CPU backend)" \
  "sshsdp bench runs on the CPU backend" \
  "${mpirun[@]}" -np 2 "$bin" bench "${small[@]}" --comm-path nccl

finish_checks
