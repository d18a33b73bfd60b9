#!/usr/bin/env python3
"""transformers' own model of a Hugging Face config.json, trained the way practitioners run it:
eager PyTorch on one process, or FSDP2 (`fully_shard` on every decoder layer, then the root)
over gloo under torchrun. AdamW, random tokens, fp32 or bf16 (torch.autocast on fp32 master
weights, what sshsdp's bf16 runtime weights over fp32 main weights compute). Prints one JSON
line: the median step time after warm-up and tokens/s over all ranks. A benchmark peer of
bench/hf_sweep.sh, never a test.

    python hf_peer.py --config bench/configs/qwen3_bench.json --seq-len 256 --batch-size 4
    torchrun --standalone --nproc_per_node 2 hf_peer.py --fsdp2 --config ... --seq-len 256
"""
import argparse
import json
import os
import statistics
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--fsdp2", action="store_true")
    a = ap.parse_args()
    rank, world = 0, 1
    if a.fsdp2:
        torch.distributed.init_process_group("gloo")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(1)
    config = transformers.AutoConfig.from_pretrained(a.config)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.float().train()
    if a.fsdp2:
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    V, B, T = config.vocab_size, a.batch_size, a.seq_len
    g = torch.Generator().manual_seed(100 + rank)
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, V, (B, T + 1), generator=g)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.fsdp2:
            torch.distributed.barrier()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    if rank == 0:
        print(json.dumps({"peer": "fsdp2" if a.fsdp2 else "eager", "world": world,
                          "dtype": a.dtype, "threads": torch.get_num_threads(),
                          "step_seconds": med, "tokens_per_s": B * T * world / med,
                          "torch": torch.__version__, "transformers": transformers.__version__}))
    if a.fsdp2:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
