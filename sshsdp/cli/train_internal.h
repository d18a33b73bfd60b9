// What `sshsdp train`'s two files share: the run as resolved before its first collective
// (train.cc: options checked, data opened, resume examined, layout fixed) and the loop over
// its steps with what ends the run (train_loop.cc). Not part of the API.
//
//   TrainRun run(o);          // train.cc, step by step, every check before any collective
//   ... build the model and the engine, load the initial state ...
//   return RunTrainLoop(run, loop);   // train_loop.cc: steps, metrics, saves, stop, final files
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/cli/fault_injection.h"
#include "sshsdp/cli/gemm_peak.h"
#include "sshsdp/cli/trace_file.h"
#include "sshsdp/cli/train.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/gpt.h"
#include "sshsdp/update/lr_schedule.h"

namespace sshsdp {

// The run's inputs, checked; filled by train.cc before any collective but AgreeOnOptions.
struct TrainRun {
  explicit TrainRun(const TrainOptions& options) : o(options) {}
  const TrainOptions& o;
  int T = 0;  // sequence length
  std::unique_ptr<TokenSource> data, val;
  GptConfig gc;  // the GPT shape (or the Llama family's trunk sizes)
  EngineConfig cfg;
  LrSchedule schedule;
  float lr_min = 0;
  TraceWindow trace_window;
  Tracer tracer;
  FaultSpec fault;
  std::optional<CheckpointRootLock> ckpt_lock;  // rank 0 of a run with --ckpt-dir
  nlohmann::json model_json;                    // what a checkpoint must match
  nlohmann::json run_json;                      // what a checkpoint records about the run
  std::string tokenizer;                        // --init-from-hf's tokenizer.json, if any
  std::string resume_dir;                       // the checkpoint resumed from ("" : none)
  std::vector<std::string> resume_notes;
};

// The live objects of the loop, and where it starts.
struct TrainLoop {
  Model* model = nullptr;
  Engine* engine = nullptr;
  Communicator* world = nullptr;
  GemmPeak gemm_peak;
  int64_t start = 0;         // first step (a resume's data position)
  int64_t first_sample = 0;  // global samples read before `start`
};

// The steps from loop.start to --steps, then the trace, --save-weights and the memory report.
// Returns the process's exit code (128 + signal after a stop signal).
int RunTrainLoop(TrainRun& run, const TrainLoop& loop);

}  // namespace sshsdp
