// Trainer (trainer.h): the engine on this job's MPI world, fed by a token source.
#include "sshsdp/trainer/trainer.h"

#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp {

Trainer::Trainer(Model& model, const TokenSource& data, TrainerOptions options)
    : o_(std::move(options)), data_(data) {
  const int W = WorldSize();
  EngineConfig& c = o_.engine;
  SSHSDP_CHECK(c.seq_len > 0, ConfigError,
               "TrainerOptions::engine.seq_len: set the tokens per sample (the model's context "
               "or less), got {}",
               c.seq_len);
  for (int* degree : {&c.sw, &c.sg, &c.so})
    if (*degree == 0) *degree = W;
  world_ = MpiCommunicator::World(c.ranks_per_node > 0 ? c.ranks_per_node : W);
  engine_ = std::make_unique<Engine>(model, *world_, c);
  engine_->InitWeights(o_.seed);
}

Trainer::~Trainer() = default;

StepStats Trainer::Step() {
  const EngineConfig& c = engine_->config();
  const int M = c.microbatches, B = c.batch_size, T = engine_->config().seq_len;
  const int r = rank(), W = world_size();
  const int64_t s = step_;
  const StepStats st = engine_->Step([&](int mb, int32_t* tok, int32_t* tgt) {
    data_.Batch(SampleIndex(s, mb, M, r, W, 0, B), B, T, tok, tgt);
  });
  ++step_;
  return st;
}

double Trainer::Evaluate(const TokenSource& val, int batches) {
  const int B = engine_->config().batch_size, T = engine_->config().seq_len;
  const int r = rank(), W = world_size();
  return engine_->Evaluate(
      [&](int i, int32_t* tok, int32_t* tgt) {
        val.Batch(SampleIndex(0, i, batches, r, W, 0, B), B, T, tok, tgt);
      },
      batches);
}

CheckpointMeta Trainer::Meta() const {
  CheckpointMeta m;
  m.model = o_.model_record.is_null() ? nlohmann::json::object() : o_.model_record;
  m.scalars = {{"data_position", step_}, {"seed", o_.seed}};
  return m;
}

SaveResult Trainer::Save() {
  SSHSDP_CHECK(!o_.ckpt_dir.empty(), ConfigError,
               "Trainer::Save: TrainerOptions::ckpt_dir names no directory");
  PrepareCheckpointRoot(o_.ckpt_dir);
  return SaveCheckpoint(*engine_, *world_, o_.ckpt_dir, Meta(), {.keep = o_.keep});
}

void Trainer::Resume(const std::string& path) {
  const std::string from = path.empty() ? o_.ckpt_dir : path;
  SSHSDP_CHECK(!from.empty(), ConfigError,
               "Trainer::Resume: no checkpoint named (and no ckpt_dir)");
  const LoadResult l = LoadCheckpoint(*engine_, *world_, from, Meta().model);
  step_ = l.manifest.meta.scalars.value("data_position", l.manifest.step);
}

}  // namespace sshsdp
