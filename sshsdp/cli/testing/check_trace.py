#!/usr/bin/env python3
"""Checks a Chrome trace of `sshsdp train --trace` against the run's --metrics (trace_test.sh).

  check_trace.py TRACE METRICS WORLD FIRST LAST

* it parses, names one process row per rank with compute and communication threads;
* every rank has exactly one "step" span for each step FIRST..LAST, and every other span of a
  rank lies inside one of its step spans;
* per step, rank 0's all-gather and reduce-scatter spans on the communication thread carry
  exactly the runtime bytes its counters report (runtime_comm_*_bytes in the metrics), and
  there are as many all-gathers as the counters' gathers;
* forward and backward spans come in equal numbers per step, none on the communication thread.
Prints one line per failed check and exits non-zero if any failed.
"""
import json
import sys


def main():
    trace, metrics, world, first, last = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    bad = []
    with open(trace) as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    if rows != {r: f"rank {r}" for r in range(world)}:
        bad.append(f"process rows {rows}")
    threads = {(e["pid"], e["tid"]) for e in ev if e.get("name") == "thread_name"}
    if threads != {(r, t) for r in range(world) for t in (0, 1)}:
        bad.append(f"thread rows {sorted(threads)}")
    spans = [e for e in ev if e["ph"] == "X"]
    m = {}
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            m[j["step"]] = j
    eps = 0.01  # µs: timestamps are printed with 3 decimals
    for r in range(world):
        steps = [e for e in spans if e["pid"] == r and e["name"] == "step"]
        nums = sorted(e["args"]["step"] for e in steps)
        if nums != list(range(first, last + 1)):
            bad.append(f"rank {r}: step spans {nums}, expected {first}..{last}")
            continue
        for e in spans:
            if e["pid"] != r or e["name"] == "step":
                continue
            inside = [s for s in steps if s["ts"] - eps <= e["ts"] and
                      e["ts"] + e["dur"] <= s["ts"] + s["dur"] + eps]
            if len(inside) != 1:
                bad.append(f"rank {r}: '{e['name']}' at {e['ts']} us is inside {len(inside)} "
                           "steps")
                break
        for s in steps:
            mine = [e for e in spans if e["pid"] == r and e is not s and
                    s["ts"] - eps <= e["ts"] <= s["ts"] + s["dur"] + eps]
            n = s["args"]["step"]
            fw = [e for e in mine if e["name"] == "forward"]
            bw = [e for e in mine if e["name"] == "backward"]
            if not fw or len(fw) != len(bw) or any(e["tid"] != 0 for e in fw + bw):
                bad.append(f"rank {r} step {n}: {len(fw)} forward, {len(bw)} backward spans")
            if r != 0:
                continue
            comm = [e for e in mine if e["tid"] == 1 and
                    e["name"] in ("all-gather", "reduce-scatter")]
            got = sum(e["args"]["bytes"] for e in comm)
            want = m[n]["runtime_comm_intra_bytes"] + m[n]["runtime_comm_inter_bytes"]
            if got != want or want == 0:
                bad.append(f"step {n}: collective spans carry {got} bytes, counters {want}")
            gathers = sum(e["name"] == "all-gather" for e in comm)
            if gathers != m[n]["gathers"]:
                bad.append(f"step {n}: {gathers} all-gather spans, counters {m[n]['gathers']}")
    for b in bad:
        print("trace check failed:", b)
    print(f"checked {len(spans)} spans of {world} ranks, steps {first}..{last}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
