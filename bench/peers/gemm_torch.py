#!/usr/bin/env python3
"""torch.mm / torch.bmm on the shapes kernels_gemm_bench prints with --shapes (JSON lines on
stdin), fp32, on torch's intra-op threads (OMP_NUM_THREADS): one JSON line per shape, the
median GFLOP/s of REPS runs after one warm-up, as kernels_gemm_bench --json prints them.
The peer of bench/gemm_sweep.sh; a benchmark, never a test."""
import json
import sys
import time

import torch


def operands(s):
    g = s["batch"] * s["heads"]
    a_shape = (s["k"], s["m"]) if s["ta"] else (s["m"], s["k"])
    b_shape = (s["n"], s["k"]) if s["tb"] else (s["k"], s["n"])
    a = torch.full((g, *a_shape), 0.5)
    b = torch.full((g, *b_shape), 0.25)
    a = a.transpose(1, 2) if s["ta"] else a  # a view: the product reads it transposed
    b = b.transpose(1, 2) if s["tb"] else b
    if g == 1:
        return (lambda: torch.mm(a[0], b[0])), 2.0 * s["m"] * s["n"] * s["k"]
    return (lambda: torch.bmm(a, b)), 2.0 * s["m"] * s["n"] * s["k"] * g


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for line in sys.stdin:
        s = json.loads(line)
        run, flops = operands(s)
        run()
        secs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            secs.append(time.perf_counter() - t0)
        secs.sort()
        print(json.dumps({"name": s["name"], "provider": "torch", "repeat": 0,
                          "threads": torch.get_num_threads(),
                          "gflops": round(flops / secs[len(secs) // 2] / 1e9, 2)}), flush=True)


if __name__ == "__main__":
    main()
