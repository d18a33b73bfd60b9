#!/usr/bin/env bash
# The one prepared device check of the CUDA backend (issue 19), for a machine with an NVIDIA
# GPU: (1) every backend op (sshsdp/backend) checked against its CPU op on the GPU; (2) GPT
# small trained for 50 steps on the GPU with the whole step on the CUDA backend
# (models/gpt.h, fp32), its losses compared with the CPU backend's run from the same
# weights and batches (first loss within 1e-5, the first five within 1e-3), tokens/s and
# fp32 TFLOP/s reported next to eager PyTorch training the same GPT on the same GPU in fp32.
# (3) The NCCL communicator against MPI's on one rank (the H200 machine has one GPU; NCCL before
# 2.30 refuses two ranks on it, which a second run checks); (4) the direct path on device
# buffers with 1, 2 and 3 processes sharing the GPU through CUDA IPC, bit for bit against the
# host direct path; (5) the engine on the GPU backend training the GPT against the host
# reference, on one rank and with 2 and 3 processes sharing the GPU (plain ZeRO-3 over CUDA
# IPC), and with MXFP8 weights (engine_backend_mx_test: G on the GPU, S on the host, weights
# dequantized for the GEMMs); (6) `sshsdp train --backend cuda` (AdamW and Muon per head, AdamW
# with MXFP8 blocks dequantized for fp32 and for bf16 GEMMs (--mx-gemm); 1 rank and 2
# processes sharing the GPU), and the MoE preset moe-small (AdamW, fp32; the engine_backend_moe_test
# cases run the MoE GPT on the GPU too) against `--backend cpu` of the same seed.
#
#   scripts/gpu_check.sh prepare   # here (the build machine, no GPU needed): build the CUDA
#                                  # tests in build-gpu/ and bundle them with the shared
#                                  # libraries a bare GPU image lacks (oneDNN, fmt) and a
#                                  # relocatable Open MPI (mpirun, orted, plugins, PMIx) into
#                                  # gpu-bundle/, packed as gpu-bundle.tar.xz (git-ignored;
#                                  # 52 MB unpacked, 10 MB packed)
#   scripts/gpu_check.sh           # on the GPU machine (device tool: carry gpu-bundle.tar.xz):
#                                  # nvidia-smi, then the op-by-op test on cuda:0; exit 0 only
#                                  # if it ran and passed (a skip is a failure here)
#
# Where the GPU machine has the whole toolchain (OpenMPI, oneDNN, GTest, fmt, nvcc), plain
# `scripts/gpu_check.sh build` builds there with -DSSHSDP_CUDA=ON and runs ctest -L gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
bundle=gpu-bundle

# A relocatable copy of this machine's Open MPI (launcher, daemon, plugins, help texts, PMIx)
# under $1/ompi, so a bare GPU image can start several processes: OPAL_PREFIX and
# PMIX_INSTALL_PREFIX point it there at run time. Plugins that need network stacks the image
# lacks (UCX, verbs, PSM, libfabric) are left out; shared memory and TCP remain.
bundle_openmpi() {
  local b=$1 ompi=$1/ompi
  local pkglib=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
  local pmix=/usr/lib/x86_64-linux-gnu/pmix2
  mkdir -p "$ompi/bin" "$ompi${pkglib#/usr}" "$ompi${pmix#/usr}/lib/pmix" "$ompi/share"
  cp -L /usr/bin/orterun "$ompi/bin/mpirun"
  cp -L /usr/bin/orted "$ompi/bin/orted"
  cp -r /usr/share/openmpi "$ompi/share/"
  [ -d /usr/share/pmix ] && cp -r /usr/share/pmix "$ompi/share/"
  cp -L "$pmix"/lib/pmix/*.so "$ompi${pmix#/usr}/lib/pmix/"
  local keep='libevent|libudev|libopen-pal|libopen-rte|libhwloc|libz\.|libmpi\.|libnuma|libpmix|libmunge|libatomic|libuuid|libmca_common_(sm|ompio|monitoring)'
  local f deps
  for f in "$pkglib"/*.so; do
    deps=$(ldd "$f" | awk '/=> \//{print $3}' |
      grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so' || true)
    if echo "$deps" | grep -vE "$keep" | grep -q .; then continue; fi  # needs a network stack
    cp -L "$f" "$ompi${pkglib#/usr}/"
    [ -n "$deps" ] && echo "$deps" | xargs -r -I{} cp -Ln {} "$b/lib/"
  done
  ldd "$ompi/bin/mpirun" "$ompi/bin/orted" "$ompi${pmix#/usr}"/lib/pmix/*.so |
    awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so' |
    xargs -r -I{} cp -Ln {} "$b/lib/"
  cp -Ln "$pmix"/lib/libpmix.so.2 "$b/lib/" 2>/dev/null || true
}

# On the GPU machine: the bundled Open MPI's launcher, found through the environment.
use_bundled_openmpi() {
  export OPAL_PREFIX="$PWD/$bundle/ompi"
  export PMIX_INSTALL_PREFIX="$PWD/$bundle/ompi/lib/x86_64-linux-gnu/pmix2"
  export PMIX_MCA_mca_base_component_path="$PMIX_INSTALL_PREFIX/lib/pmix"
  export PATH="$OPAL_PREFIX/bin:$PATH"
}
case "$mode" in
  prepare)
    # Its own build directory: -DSSHSDP_CUDA=ON is not left in build/'s cache.
    BUILD_DIR=build-gpu \
      BUILD_TARGETS="backend_test device_nccl_test device_direct_test engine_backend_gpt_test engine_backend_mx_test engine_backend_moe_test sshsdp" \
      scripts/build.sh -DSSHSDP_CUDA=ON
    rm -rf "$bundle" && mkdir -p "$bundle/lib"
    cp build-gpu/sshsdp/backend/backend_test build-gpu/sshsdp/device/device_nccl_test \
      build-gpu/sshsdp/device/device_direct_test \
      build-gpu/sshsdp/engine/engine_backend_gpt_test build-gpu/sshsdp/engine/engine_backend_mx_test \
      build-gpu/sshsdp/engine/engine_backend_moe_test build-gpu/bin/sshsdp "$bundle/"
    # Every shared library outside the C library and CUDA's own (the GPU image has those; NCCL
    # too: the toolkit's, or the nvidia-nccl wheel next to PyTorch).
    ldd "$bundle"/device_*_test \
      "$bundle"/engine_backend_*_test "$bundle"/sshsdp |
      awk '/=> \//{print $3}' | sort -u |
      grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|/cuda|libcu|libnccl' |
      xargs -r -I{} cp -L {} "$bundle/lib/"
    ldd --version | sed -n 1p >"$bundle/built-with-glibc"
    bundle_openmpi "$bundle"
    # One compressed file to carry (oneDNN alone is 40 MB; xz: the whole bundle ~15 MB).
    tar -cJf "$bundle.tar.xz" "$bundle"
    du -sh "$bundle" "$bundle.tar.xz"
    ;;
  build)
    BUILD_DIR=build-gpu scripts/build.sh -DSSHSDP_CUDA=ON
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    ctest --test-dir build-gpu -L gpu --output-on-failure
    build-gpu/sshsdp/backend/backend_test --backend=cuda  # exit 77 (skip) is a failure
    ;;
  run)
    [ -x "$bundle/backend_test" ] || [ ! -f "$bundle.tar.xz" ] || tar -xJf "$bundle.tar.xz"
    [ -x "$bundle/backend_test" ] || {
      echo "gpu_check.sh: no $bundle/ (run 'scripts/gpu_check.sh prepare' first and carry" \
        "$bundle.tar.xz)" >&2
      exit 2
    }
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    echo "bundle built with: $(cat "$bundle/built-with-glibc"); here: $(ldd --version | sed -n 1p)"
    # cudart / cuBLAS 13: the toolkit's, or the nvidia-* wheels next to PyTorch.
    site=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
    cuda_libs=$(find /usr/local /usr/lib /opt ${site:+"$site"} -name 'libcublas.so.13*' \
      2>/dev/null | head -1 | xargs -r dirname)
    rt_libs=$(find /usr/local /usr/lib /opt ${site:+"$site"} -name 'libcudart.so.13*' \
      2>/dev/null | head -1 | xargs -r dirname)
    nccl_libs=$(find /usr/local /usr/lib /opt ${site:+"$site"} -name 'libnccl.so.2*' \
      2>/dev/null | head -1 | xargs -r dirname)
    export LD_LIBRARY_PATH="$PWD/$bundle/lib:${cuda_libs}:${rt_libs}:${nccl_libs}:${LD_LIBRARY_PATH:-}"
    if ldd "$bundle/backend_test" | grep 'not found'; then
      echo "gpu_check.sh: shared libraries missing on this machine (above)" >&2
      exit 1
    fi
    rc=0
    "$bundle/backend_test" --backend=cuda || rc=$?
    [ $rc -eq 77 ] && echo "gpu_check.sh: the CUDA test skipped on a GPU machine: a failure" >&2
    out=${OUT:-/tmp}
    echo "== GPT small, 50 steps, fp32: CPU backend (reference) and CUDA backend =="
    # The one GPT (models/gpt.h) trained by the engine at world size 1 on each backend.
    gpt=(train --model small --weight-dtype fp32 --steps 50 --microbatches 4 --batch-size 4
      --log-every 10 --gemm-peak 1)
    "$bundle/sshsdp" "${gpt[@]}" --backend cpu --metrics "$out/gpt_cpu.jsonl" || rc=1
    "$bundle/sshsdp" "${gpt[@]}" --backend cuda --metrics "$out/gpt_cuda.jsonl" || rc=1
    python3 - "$out/gpt_cpu.jsonl" "$out/gpt_cuda.jsonl" <<'PY' || rc=1
import json, statistics, sys
cpu, gpu = ([json.loads(l) for l in open(p) if '"grad_norm"' in l] for p in sys.argv[1:3])
a, b = [r["loss"] for r in cpu], [r["loss"] for r in gpu]
rel = [abs(x - y) / abs(y) for x, y in zip(b, a)]
print(f"losses cpu {[round(x, 6) for x in a[:5]]}\n       gpu {[round(x, 6) for x in b[:5]]}")
print(f"relative difference: first {rel[0]:.2e}, max of the first 5 {max(rel[:5]):.2e}, "
      f"of all 50 {max(rel):.2e}")
tps = lambda rows: statistics.median(r["tokens_per_s"] for r in rows[2:])
print(f"tokens/s (median after 2 steps): cuda {tps(gpu):.0f}, cpu {tps(cpu):.0f} (fp32, no TF32)")
sys.exit(0 if rel[0] <= 1e-5 and max(rel[:5]) <= 1e-3 else 1)
PY
    echo "== eager PyTorch on the same GPU, same GPT, fp32 =="
    python3 - <<'PY' || echo "gpu_check.sh: the PyTorch run failed (reported, not fatal)"
import sys, time, torch
sys.path.insert(0, "bench/peers")
from peer_models import build_model
m = {"type": "gpt", "vocab": 256, "seq_len": 128, "d_model": 128, "n_head": 4, "n_layer": 4,
     "d_ff": 512}
torch.backends.cuda.matmul.allow_tf32 = False  # fp32, as the CUDA backend (pedantic cuBLAS)
model = build_model(m).cuda()
for p in model.parameters():
    torch.nn.init.normal_(p, std=0.02)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
tok = torch.randint(0, 256, (4, 4, 128), device="cuda")
def step():
    for mb in range(4):
        (model(tok[mb], tok[mb]) / 4).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(3): step()
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(20): step()
torch.cuda.synchronize(); dt = (time.perf_counter() - t0) / 20
print(f"torch {torch.__version__} eager on {torch.cuda.get_device_name()}: "
      f"{4 * 4 * 128 / dt:.0f} tokens/s (fp32, no TF32)")
PY
    use_bundled_openmpi
    echo "== NCCL communicator against MPI's (device_nccl_test) =="
    if ldd "$bundle/device_nccl_test" | grep 'not found'; then
      echo "gpu_check.sh: NCCL test not run: libraries missing (above)"
    else
      timeout 180 mpirun --allow-run-as-root -np 1 "$bundle/device_nccl_test" || rc=1
      # One GPU: two ranks must be refused by name (77) under NCCL < 2.30, or pass.
      r=0
      timeout 180 mpirun --allow-run-as-root -np 2 "$bundle/device_nccl_test" || r=$?
      [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
    fi
    echo "== direct path on device buffers, processes sharing the GPU (device_direct_test) =="
    for np in 1 2 3; do
      timeout 180 mpirun --allow-run-as-root --oversubscribe -np $np \
        "$bundle/device_direct_test" --memory=cuda || rc=1
    done
    echo "== the engine on the GPU backend vs the host reference (engine_backend_{gpt,mx,moe}_test) =="
    for t in gpt:EngineOnBackend mx:EngineMxOnBackend moe:EngineBackendMoe; do
      for np in 1 2 3; do
        log="${OUT:-/tmp}/engine_${t%%:*}_cuda_np$np.log"
        r=0
        SSHSDP_TEST_BACKEND=cuda timeout 240 mpirun --allow-run-as-root --oversubscribe -np $np \
          -x SSHSDP_TEST_BACKEND "$bundle/engine_backend_${t%%:*}_test" \
          --gtest_filter="${t#*:}.OnTheCudaBackend" >"$log" 2>&1 || r=$?
        tail -5 "$log"
        if [ $r -ne 0 ] || grep -q '\[  SKIPPED \]' "$log"; then rc=1; fi
      done
    done
    echo "== sshsdp train --backend cuda (GPT small, 1 rank and 2 processes sharing the GPU) =="
    # AdamW with fp32 weights: the first 5 losses of --backend cuda within 1e-4 of --backend
    # cpu's (same seed; the GPU sums in another order). Muon per head with bf16 weights (tensor-
    # core products; bf16 u amplifies summation order): within 2e-2. AdamW with MXFP8 blocks
    # (dequantized for fp32 GEMMs; a main weight off in its last bits can flip a code): 2e-3;
    # dequantized to bf16 for tensor-core GEMMs (--mx-gemm bf16, the fast path): 2e-2.
    # The MoE preset (moe-small, AdamW, fp32; routed on the GPU from its own logits, a
    # near-tie may route a token elsewhere): 1e-3. All: loss falls over 30.
    for np in 1 2; do
      for run in "small adamw fp32 1e-4 fp32" "small muon bf16 2e-2 fp32" \
        "small adamw mxfp8 2e-3 fp32" "small adamw mxfp8 2e-2 bf16" "moe-small adamw fp32 1e-3 fp32"; do
        read -r model opt wdt tol mxg <<<"$run"
        for b in cpu cuda; do
          steps=5
          [ $b = cuda ] && steps=30
          tag="${b}_${model}_${opt}_${wdt}_${mxg}_np$np"
          extra=()
          [ "$wdt" = mxfp8 ] && extra=(--mx-gemm "$mxg")
          timeout 240 mpirun --allow-run-as-root --oversubscribe --bind-to none -np $np \
            "$bundle/sshsdp" train --backend $b --model $model --optimizer $opt \
            --weight-dtype $wdt ${extra[@]+"${extra[@]}"} --steps $steps --log-every 1 \
            --metrics "$out/train_$tag.jsonl" >"$out/train_$tag.log" 2>&1 || rc=1
          tail -2 "$out/train_$tag.log"
        done
        python3 - "$out/train_cpu_${model}_${opt}_${wdt}_${mxg}_np$np.jsonl" \
          "$out/train_cuda_${model}_${opt}_${wdt}_${mxg}_np$np.jsonl" "$model $opt $wdt $mxg" \
          "$tol" <<'PY' || rc=1
import json, sys
cpu, gpu = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
tol = float(sys.argv[4])
for c, g in zip(cpu[:5], gpu[:5]):
    assert abs(c["loss"] - g["loss"]) <= tol * abs(c["loss"]), (c["step"], c["loss"], g["loss"])
assert gpu[-1]["loss"] < gpu[0]["loss"], [g["loss"] for g in gpu]
print(f"{sys.argv[3]}: first losses agree within {tol}; cuda {gpu[-1]['tokens_per_s']:.0f} "
      f"tok/s, MFU {100 * gpu[-1]['mfu']:.1f}% of the measured GEMM peak of that dtype")
PY
      done
    done
    exit $((rc == 0 ? 0 : 1))
    ;;
  *)
    echo "usage: scripts/gpu_check.sh [prepare|run|build]" >&2
    exit 2
    ;;
esac
