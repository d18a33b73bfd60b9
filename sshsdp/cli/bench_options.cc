// The options of `sshsdp bench` (see bench.h).
#include <CLI/CLI.hpp>

#include "sshsdp/cli/bench.h"

#include "sshsdp/cli/run_config.h"
#include "sshsdp/cli/train.h"

namespace sshsdp {

void AddBenchOptions(CLI::App& app, BenchOptions& o) {
  app.add_option("--model", o.model,
                 "model preset: tiny | small | base | moe-tiny | moe-small | qwen3-tiny | "
                 "qwen3-small | qwen3-moe-tiny | llama-tiny");
  app.add_option("--model-config", o.model_config,
                 "a Hugging Face config.json (llama, qwen3, qwen3_moe) instead of --model")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "override the preset's number of blocks");
  app.add_option("--d-model", o.d_model, "override the preset's width");
  app.add_option("--heads", o.heads, "override the preset's attention heads");
  app.add_option("--seq-len", o.seq_len, "tokens per sample (<= the preset's maximum)");
  app.add_option("--batch-size", o.batch_sizes,
                 "samples per microbatch per rank; a comma-separated list sweeps workloads")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--microbatches", o.microbatches, "microbatches per optimizer step")
      ->capture_default_str();
  AddLayoutDegreeOptions(app, &o.sw, &o.sg, &o.so);
  app.add_option("--ranks-per-node", o.ranks_per_node, "ranks per (simulated) node");
  app.add_option("--weight-dtype", o.weight_dtype, "runtime weight dtype: bf16 | fp32")
      ->capture_default_str();
  app.add_option("--attention-dtype", o.attention_dtype,
                 "attention's operands: auto (bf16 where the QKV weights are bf16, as "
                 "torch.autocast; every preset alike) | fp32")
      ->capture_default_str();
  app.add_option("--presets", o.presets,
                 "comma-separated presets (default: sshsdp,fsdp2,megatron-fsdp,vescale-fsdp)")
      ->delimiter(',');
  app.add_option("--comm-path", o.comm_paths,
                 "per-microbatch all-gather/reduce-scatter path(s): collective | direct | "
                 "collective,direct (each preset on each path; direct rows are '<preset>+direct')")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--overlap-outer", o.overlap_outer,
                 "outer phase (outer reduce-scatter, HSDP all-reduce, outer all-gather): on "
                 "(overlapping backward and the next forward) | off (in the update phase) | "
                 "on,off (each preset both ways; off rows are '<preset>/outer-sync'; --ablation "
                 "uses the first)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("--ablation", o.ablation,
               "instead of presets: fsdp2, then turn sshsdp's optimizations on one at a time");
  app.add_flag("--sequential", o.sequential,
               "time each configuration's steps back to back instead of round-robin");
  app.add_option("--warmup", o.warmup, "untimed steps per configuration")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per configuration (median reported)")
      ->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--optimizer", o.optimizer,
                 "adamw | muon (Muon for matrices per --muon-unit, AdamW for the rest; "
                 "megatron-fsdp has no structured updates and is left out)")
      ->capture_default_str();
  app.add_option("--muon-unit", o.muon_unit, "Muon unit: head | matrix")->capture_default_str();
  app.add_option("--muon-lr", o.muon_lr, "Muon learning rate")->capture_default_str();
  app.add_option("--clip", o.clip, "gradient-norm clipping (0: off)")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of initial weights and synthetic data")
      ->capture_default_str()
      ->check(IntegerAtLeast(0));
  app.add_option("--gemm-peak", o.gemm_peak,
                 "MFU denominator in GFLOP/s per rank (0: measured with all ranks at once)")
      ->capture_default_str();
  app.add_option("--comm-timeout", o.comm_timeout,
                 "watchdog: seconds a blocking wait may last before the job ends (0: never)")
      ->capture_default_str();
  app.add_option("--json", o.json, "write the table as JSON to this file");
  app.add_option("--trace", o.trace,
                 "write a Chrome trace of each configuration's first timed step (first "
                 "--batch-size): a row per configuration and rank (scripts/plot_trace.py)");
  app.add_flag("--profile", o.profile,
               "add the step profile: the model's kernel time by category (gemm, attention, "
               "norm, activation, loss, embedding, elementwise, routing) next to comm wait, "
               "copies, optimizer and other, in ms and % of the step");
  app.add_option("--peer-inputs", o.peer_inputs,
                 "write initial weights, token batches and the workload for the PyTorch peer "
                 "(bench/peers/fsdp2_peer.py) under this directory");
}

}  // namespace sshsdp
