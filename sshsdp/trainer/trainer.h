// Trainer: the front door of the library — a model, a token source and a layout in, training
// steps, evaluations and checkpoints out, on this job's MPI ranks. It is the engine
// (engine/engine.h) plus what every training loop around it does: the MPI world, the initial
// weights, which samples each rank reads at each step, checkpoints with their step and data
// position. The lower-level headers stay for those who need them.
//
//   int main(int argc, char** argv) {
//     return sshsdp::RunMpiMain(argc, argv, [&] {
//       MyModel model(...);                            // implements sshsdp::Model
//       sshsdp::SyntheticTokens data(64, /*seed=*/5);  // or sshsdp::TokenFile("train.bin", ...)
//       sshsdp::TrainerOptions opt;
//       opt.engine.batch_size = 4;                     // layout, optimizer, precision:
//       EngineConfig opt.engine.seq_len = 16; opt.ckpt_dir = "out/ckpt"; sshsdp::Trainer
//       trainer(model, data, opt);     // fully sharded over the world for (int s = 0; s < 100;
//       ++s) trainer.Step(); trainer.Save(); return 0;
//     });
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/comm/communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/models/data.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

struct TrainerOptions {
  // Layout, batch, tokens per sample (seq_len: set it), optimizer, precision, communication path
  // (engine/engine.h). Degrees sw, sg, so of 0 mean the world size (all 0, the default: fully
  // sharded, as FSDP2's fully_shard).
  EngineConfig engine = FullySharded();
  uint64_t seed = 1;            // initial weights
  std::string ckpt_dir;         // where Save() writes (and Resume("") reads)
  int keep = 0;                 // checkpoints kept by Save() (0: all)
  nlohmann::json model_record;  // what a checkpoint says of the model; a resume must match it

  static EngineConfig FullySharded() {
    EngineConfig c;
    c.sw = c.sg = c.so = 0;
    return c;
  }
};

class Trainer {
 public:
  // On every rank of this job (inside RunMpiMain). ConfigError / LayoutError naming what is
  // wrong before any collective.
  Trainer(Model& model, const TokenSource& data, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step over the next samples of the data (every rank its own share).
  StepStats Step();
  // Mean loss over `batches` microbatches of `val` per rank, forward only (collective).
  double Evaluate(const TokenSource& val, int batches);
  // A checkpoint of weights, optimizer state, step and data position in ckpt_dir (collective).
  SaveResult Save();
  // Continues from a checkpoint: a step directory or a root (its latest); "" is ckpt_dir.
  void Resume(const std::string& path = "");

  int64_t step() const { return step_; }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  Engine& engine() { return *engine_; }
  Communicator& world() { return *world_; }

 private:
  CheckpointMeta Meta() const;

  TrainerOptions o_;
  const TokenSource& data_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Engine> engine_;
  int64_t step_ = 0;
};

}  // namespace sshsdp
