#!/usr/bin/env python3
"""A real outside peer for `sshsdp bench`: the same GPT trained with PyTorch FSDP2.

Why: the paper's claims are ratios against PyTorch FSDP2. The `fsdp2` preset reproduces
FSDP2's dataflow inside our engine; this script measures the real thing on the same machine,
same workload, same initial weights and the same token batches, so the ratio can be checked
against what a CPU user of FSDP2 actually gets.

It reads what `sshsdp bench --peer-inputs DIR` wrote for one workload (DIR/b<B>):
  init.safetensors  initial fp32 weights under sshsdp's update-parameter names
                    (blocks.0.attn.qkv for the fused model of AdamW runs; per-head parts
                    blocks.0.attn.q.h2, ... are concatenated, all Q heads then all K then
                    all V, into the packed [3d, d] QKV weight)
  batches.bin       int32 tokens then targets, [steps, microbatches, ranks, B, T]
  workload.json     model sizes, B, T, microbatches, world, steps, AdamW, clipping, and
                    sshsdp's rows (per-step losses, tokens/s)

The model (peer_models.py) is sshsdp/models/gpt.cc in PyTorch: token + learned position
embeddings, pre-norm blocks (RMSNorm eps 1e-5 → packed QKV → causal attention → proj →
residual; RMSNorm → fc1 → GELU tanh → fc2 → residual), final RMSNorm, untied LM head, mean
cross-entropy, no biases; for an MoE workload (--model moe-*) sshsdp/models/moe.h's MoE
blocks: fp32 router, top-k gating, load-balancing loss, experts stacked [E, out, in] and run
in a loop over experts as torchtitan runs them on a CPU (peer_models.py says more).
FSDP2 (torch.distributed.fsdp.fully_shard) wraps the embeddings, every block and the head
(the same runtime groups as sshsdp), on CPU with gloo; MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32) when the workload's weights are bf16. AdamW (decoupled decay, none on norm
gains), global-norm clipping, gradient accumulation over microbatches with FSDP2's default
reduce-scatter on every microbatch.

  torchrun --standalone --nproc_per_node 2 bench/peers/fsdp2_peer.py --inputs out/peer/b4 \
      --out out/peer/b4/fsdp2_peer.json [--check-steps 3 --check-tol 1e-4]

With --eager (one process only) the same model trains as a plain eager PyTorch loop — no
FSDP, no process-group collectives in the step, bf16 workloads under torch.autocast — the
single-process peer of issue 20 (run_fsdp2_peer.sh with PEER=eager NP=1).

With --profile, two more steps (the last step's batches again) run under torch.profiler after
the timed ones, and rank 0 prints where they went in the categories of `sshsdp bench
--profile`: each op's self CPU time by its name (ops inside the clipping and optimizer
step count as optimizer) (aten::mm / addmm / bmm -> gemm, scaled dot
product attention -> attention, gelu / silu -> activation, log_softmax / nll_loss -> loss,
embedding -> embedding, the MoE router's softmax / sigmoid / topk / bincount and the
experts' token gathers and index_add -> routing, c10d / gloo collectives -> comm,
_foreach_* / AdamW -> optimizer, every other aten op -> "norm + elementwise", since this model's RMSNorm is written in elementwise ops as users write it) and
"other" for the rest of the wall time (dispatcher, autograd engine, Python). The profiler's own
overhead lands in "other"; the shares are of the profiled steps' wall time.
"""
import argparse
import json
import os
import resource
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from peer_models import build_model

def read_safetensors(path):
    """Minimal safetensors reader (F32 / BF16) → {name: float32 numpy array}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = data[a:b]
        if meta["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif meta["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        out[name] = arr.reshape(meta["shape"]).copy()
    return out


def op_category(name):
    """The `sshsdp bench --profile` category of a PyTorch op, by its name."""
    n = name.lower()
    if any(k in n for k in ("c10d", "gloo", "allreduce", "all_reduce", "all_gather",
                            "allgather", "reduce_scatter")):
        return "comm"
    if "scaled_dot_product" in n or "flash_attention" in n:
        return "attention"
    if n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
             "aten::linear"):
        return "gemm"
    if "gelu" in n or "silu" in n:
        return "activation"
    if "log_softmax" in n or "nll_loss" in n or "cross_entropy" in n:
        return "loss"
    if "embedding" in n:
        return "embedding"
    if n in ROUTING_OPS:
        return "routing"
    if "_foreach" in n or "adam" in n or "optimizer" in n or "clip_grad" in n:
        return "optimizer"
    if n.startswith("aten::"):
        return "norm + elementwise"
    return "other"


# The MoE router's and the expert loop's ops (the dense model calls none of them).
ROUTING_OPS = {"aten::_softmax", "aten::softmax", "aten::sigmoid", "aten::topk",
               "aten::bincount", "aten::nonzero", "aten::index", "aten::index_add",
               "aten::index_add_", "aten::gather", "aten::index_put_",
               "aten::_index_put_impl_", "aten::_softmax_backward_data",
               "aten::sigmoid_backward", "aten::scatter_add_", "aten::scatter_add"}
PROFILE_ORDER = ["gemm", "attention", "norm + elementwise", "activation", "loss", "embedding",
                 "routing", "comm", "optimizer", "other"]


def profile_steps(run_step, steps):
    """Runs run_step() `steps` times under torch.profiler; ms per step by category."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            run_step()
        wall = time.perf_counter() - t0
    ms = {c: 0.0 for c in PROFILE_ORDER}
    for e in prof.events():
        # Ops inside the step's optimizer range (clipping's norm, AdamW) count as optimizer,
        # as sshsdp counts its gradient norm and update; the rest by their own names.
        cat, up = op_category(e.name), e.cpu_parent
        while up is not None:
            if up.name == "sshsdp.optimizer":
                cat = "optimizer"
                break
            up = up.cpu_parent
        ms[cat] += e.self_cpu_time_total / 1e3
    rest = wall * 1e3 - sum(ms.values())
    if rest < 0:  # self times of other threads can exceed the caller's wall time
        print(f"profile: op self times exceed the wall time by {-rest:.1f} ms (other threads)",
              flush=True)
    ms["other"] += max(rest, 0.0)
    return {c: v / steps for c, v in ms.items()}, wall * 1e3 / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", required=True, help="directory written by sshsdp bench --peer-inputs")
    ap.add_argument("--out", help="write this run's JSON row here (rank 0)")
    ap.add_argument("--check-steps", type=int, default=0,
                    help="compare the first N step losses with sshsdp's (fairness check)")
    ap.add_argument("--check-tol", type=float, default=1e-4, help="relative loss tolerance")
    ap.add_argument("--eager", action="store_true",
                    help="one process, plain eager PyTorch (no FSDP): the single-process peer")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, profile two more and print the step profile")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    wl = json.load(open(os.path.join(args.inputs, "workload.json")))
    m = wl["model"]
    B, T, M = wl["batch_size"], wl["T"], wl["microbatches"]
    steps_total = wl["warmup"] + wl["steps"]
    if wl["world"] != W:
        raise SystemExit(f"workload was written for {wl['world']} ranks, running on {W}")
    if args.eager and W != 1:
        raise SystemExit(f"--eager runs one process, got {W} (torchrun --nproc_per_node 1)")
    raw = np.fromfile(os.path.join(args.inputs, "batches.bin"), dtype="<i4")
    shape = (steps_total, M, W, B, T)
    n = int(np.prod(shape))
    if raw.size != 2 * n:
        raise SystemExit(f"batches.bin holds {raw.size} int32, expected {2 * n}")
    tokens = torch.from_numpy(raw[:n].reshape(shape).astype(np.int64))
    targets = torch.from_numpy(raw[n:].reshape(shape).astype(np.int64))

    model = build_model(m)
    model.load_sshsdp(read_safetensors(os.path.join(args.inputs, "init.safetensors")))
    bf16 = wl["weight_dtype"] == "bf16"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32,
                              reduce_dtype=torch.float32)
    if not args.eager:
        fully_shard(model.emb, mp_policy=mp)
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
        fully_shard(model.head, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.eager and bf16)
    label = "torch eager (real)" if args.eager else "torch-fsdp2 (real)"
    who = "eager peer" if args.eager else "fsdp2 peer"

    a = wl["adamw"]
    decay = [p for name, p in model.named_parameters() if not name.endswith(".g")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith(".g")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=a["lr"], betas=(a["beta1"], a["beta2"]), eps=a["eps"])
    kind = "GPT" if m.get("type", "gpt") == "gpt" else (
        f"MoE GPT (E={m['n_expert']} top-{m['top_k']} f={m['d_expert']}, "
        f"MoE blocks {m['moe_layers']})")
    if rank == 0:
        print(f"{who}: torch {torch.__version__}, gloo, {W} ranks, {torch.get_num_threads()} "
              f"thread(s)/rank, {kind} d={m['d_model']} L={m['n_layer']} H={m['n_head']} T={T}, "
              f"batch {M}x{B}x{T} per rank, weights {wl['weight_dtype']}"
              + ("" if args.eager else "; note: gloo emulates reduce-scatter with all-reduce, "
                 "so this is what a CPU user of FSDP2 actually gets"), flush=True)

    def step(s):
        loss_sum = torch.zeros(())
        for mb in range(M):
            with autocast:
                loss = model(tokens[s, mb, rank], targets[s, mb, rank])
            (loss / M).backward()
            loss_sum += loss.detach().float()
        with torch.profiler.record_function("sshsdp.optimizer"):  # a label for --profile
            if wl["clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), wl["clip"])
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss_sum

    losses, secs = [], []
    for s in range(steps_total):
        dist.barrier()
        t0 = time.perf_counter()
        loss_sum = step(s)
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        dist.all_reduce(loss_sum)
        losses.append(loss_sum.item() / (M * W))
        if s >= wl["warmup"]:
            secs.append(dt.item())

    profiled = None
    if args.profile:
        dist.barrier()
        profiled = profile_steps(lambda: step(steps_total - 1), 2)

    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    ok = True
    if rank == 0:
        median = statistics.median(secs)
        tps = M * B * T * W / median
        ref = next((r for r in wl["rows"] if r["config"] == "sshsdp"), wl["rows"][0])
        row = {
            "batch_size": B, "tokens_per_microbatch": B * T, "config": label,
            "median_step_s": median, "tokens_per_s": tps,
            "sshsdp_tokens_per_s": ref["tokens_per_s"],
            "sshsdp_over_peer": ref["tokens_per_s"] / tps,
            "mfu": wl["flops_per_token"] * tps / (wl["gemm_peak_flops"] * W),
            "peak_rss_mib": rss.item(), "losses": losses, "warmup": wl["warmup"],
            "timed_steps": wl["steps"], "torch": torch.__version__,
            "step_s": secs, "step_s_min": min(secs), "step_s_max": max(secs),
            "note": "eager, no FSDP" if args.eager else "gloo emulates reduce-scatter with all-reduce",
        }
        print(f"{who}: {len(secs)} timed steps after {wl['warmup']} warm-up: median "
              f"{median * 1e3:.1f} ms, {tps:.0f} tok/s, MFU {100 * row['mfu']:.2f}%, peak RSS "
              f"{rss.item():.0f} MiB; sshsdp {ref['tokens_per_s']:.0f} tok/s = "
              f"{row['sshsdp_over_peer']:.2f}x this peer", flush=True)
        if profiled is not None:
            ms, wall = profiled
            row["profile"] = {"step_ms": wall, "ms": ms}
            print(f"{who} step profile (2 profiled steps, {wall:.1f} ms per step under the "
                  "profiler; ms per step and % of it):", flush=True)
            print("  " + "  ".join(f"{c} {ms[c]:.1f} ({100 * ms[c] / wall:.1f}%)"
                                   for c in PROFILE_ORDER), flush=True)
        if args.check_steps > 0:
            theirs = ref["losses"][: args.check_steps]
            worst = max(abs(x - y) / abs(y) for x, y in zip(losses, theirs))
            row["check"] = {"steps": args.check_steps, "max_rel_diff": worst, "tol": args.check_tol}
            ok = worst <= args.check_tol
            print(f"fairness check: first {args.check_steps} step losses peer "
                  f"{[round(x, 6) for x in losses[:args.check_steps]]} vs sshsdp "
                  f"{[round(y, 6) for y in theirs]}: max relative difference {worst:.2e} "
                  f"({'PASS' if ok else 'FAIL'}, tolerance {args.check_tol:.0e})", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(row, f, indent=2)
            if args.check_steps > 0:
                with open(args.out + ".check", "w") as f:
                    json.dump({"passed": ok}, f)
    # The verdict is written: a teardown failure (seen: an intermittent abort while gloo's
    # process group is destroyed) must not turn it into another exit status.
    sys.stdout.flush()
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - any teardown error is reported, not fatal
        print(f"fsdp2 peer: rank {rank}: teardown: {e}", file=sys.stderr, flush=True)
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
