// What `sshsdp bench`'s three files share: the checked inputs (bench.cc), one workload's
// configurations built, warmed up and timed (bench_workload.cc), and their table and JSON
// (bench_report.cc). Not part of the API.
//
//   BenchRun run(o);  CheckInputs(run);                     // bench.cc, before any collective
//   for (int B : o.batch_sizes) {
//     std::vector<BenchRow> rows = RunWorkload(job, B, traced);  // collective
//     ReportWorkload(job, B, rows, &json);                  // rank 0
//   }
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sshsdp/base/trace.h"
#include "sshsdp/cli/bench.h"
#include "sshsdp/cli/bench_profile.h"
#include "sshsdp/cli/gemm_peak.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/models/llama.h"

namespace sshsdp {

// One configuration's figures on one workload.
struct BenchRow {
  int batch = 0;
  std::string label;
  std::string switches, layout, qkv;  // qkv: the model its users write (QkvModelName)
  double median_s = 0, tokens_per_s = 0, mfu = 0, ratio = 0, flops_per_token = 0;
  double rss_mib = 0, accounted_mib = 0;
  std::map<std::string, double> accounted_by_category;  // MiB, rank 0
  StepCounters counters;                                // rank 0, last timed step
  TimeSplit time;                                       // mean over ranks and timed steps
  std::vector<double> losses;                           // every step, warm-up included
  std::vector<double> step_s;                           // timed steps (slowest rank), in order
  double ratio_paired = 0;  // round-robin: median over rounds of sshsdp step / this step
  bool has_paired = false;  // false with --sequential (steps of different rows never paired)
  std::string reference;    // the row ratios are taken against
  StepProfile profile;      // --profile
};

// The inputs, checked before any collective.
struct BenchRun {
  explicit BenchRun(const BenchOptions& options) : o(options) {}
  const BenchOptions& o;
  GptConfig gc;  // the GPT trunk (or the Llama family's summary)
  int T = 0;     // sequence length
  bool muon = false;
  std::vector<std::string> presets;
  EngineConfig base;  // the layout and hyperparameters every configuration shares
  int rpn = 0;        // ranks per node
};

// The job the workloads run in.
struct BenchJob {
  const BenchRun* run = nullptr;
  Communicator* world = nullptr;
  SyntheticTokens* data = nullptr;
  GemmPeak gemm_peak;
  Tracer* tracer = nullptr;                        // --trace: the first batch size's configurations
  std::vector<std::string>* trace_rows = nullptr;  // their rows, in order
};

// The Llama-family model of --model-config or a qwen3-* / llama-* preset, else none.
std::optional<LlamaConfig> BenchLlama(const BenchOptions& o);

// The model a configuration's users write (presets.h, PresetQkvModel).
std::unique_ptr<Model> MakeBenchModel(const BenchOptions& o, const GptConfig& trunk, QkvModel qkv);

// bench_workload.cc: every configuration on batch size B, built, warmed up and timed; ratios
// against the reference row filled in (collective). `traced`: one step of each configuration
// goes into job.tracer, its rows named in job.trace_rows.
std::vector<BenchRow> RunWorkload(const BenchJob& job, int B, bool traced);

// bench_report.cc, rank 0: the workload's table (and the profile and update-phase tables when
// asked), its rows appended to `json`, and with --peer-inputs its workload.json.
void ReportWorkload(const BenchJob& job, int B, const std::vector<BenchRow>& rows,
                    nlohmann::json* json);

}  // namespace sshsdp
