// The front door (trainer.h) on this test's ranks: the reference GPT trained through a Trainer
// equals the engine driven by hand with the same options and samples, bit for bit; a
// checkpoint it saves resumes into another Trainer that goes on bit for bit; options it cannot
// run are refused by name.
#include "sshsdp/trainer/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/models/gpt.h"

namespace sshsdp {
namespace {

namespace fs = std::filesystem;

GptConfig Tiny() {
  GptConfig c = GptConfig::Preset("tiny");
  c.n_layer = 1, c.d_model = 32, c.n_head = 2, c.seq_len = 16;
  return c;
}

TrainerOptions Options() {
  TrainerOptions o;
  o.engine.microbatches = 2;
  o.engine.batch_size = 2;
  o.engine.seq_len = 16;
  o.engine.weight_dtype = DType::kF32;
  o.seed = 7;
  o.model_record = {{"type", "gpt-test"}};
  return o;
}

TEST(Trainer, EqualsTheEngineDrivenByHand) {
  const SyntheticTokens data(256, /*seed=*/3);
  Gpt a(Tiny()), b(Tiny());
  Trainer trainer(a, data, Options());
  EXPECT_EQ(trainer.engine().topology().sw(), WorldSize());  // fully sharded by default
  EngineConfig c = Options().engine;
  c.sw = c.sg = c.so = WorldSize();
  auto world = MpiCommunicator::World(WorldSize());
  Engine engine(b, *world, c);
  engine.InitWeights(7);
  const int W = world->size(), r = world->rank();
  for (int64_t s = 0; s < 3; ++s) {
    const StepStats mine = trainer.Step();
    const StepStats hand = engine.Step([&](int mb, int32_t* tok, int32_t* tgt) {
      data.Batch(SampleIndex(s, mb, 2, r, W, 0, 2), 2, 16, tok, tgt);
    });
    EXPECT_EQ(mine.loss, hand.loss) << "step " << s;
    EXPECT_EQ(mine.grad_norm, hand.grad_norm) << "step " << s;
  }
  EXPECT_EQ(trainer.step(), 3);
  EXPECT_EQ(trainer.Evaluate(data, 2), engine.Evaluate(
                                           [&](int i, int32_t* tok, int32_t* tgt) {
                                             data.Batch(SampleIndex(0, i, 2, r, W, 0, 2), 2, 16,
                                                        tok, tgt);
                                           },
                                           2));
}

TEST(Trainer, SavesAndResumesBitForBit) {
  const SyntheticTokens data(256, /*seed=*/3);
  auto world = MpiCommunicator::World(WorldSize());
  int32_t pid = static_cast<int32_t>(::getpid()), all[64] = {};
  world->AllGather(&pid, all, 4, DType::kE4M3);  // rank 0's pid names the shared directory
  const fs::path dir = fs::temp_directory_path() / fmt::format("sshsdp_trainer_test_{}", all[0]);
  TrainerOptions o = Options();
  o.ckpt_dir = dir.string();
  Gpt a(Tiny()), b(Tiny());
  Trainer first(a, data, o);
  first.Step();
  first.Step();
  first.Save();
  Trainer second(b, data, o);
  second.Resume();
  EXPECT_EQ(second.step(), 2);
  for (int s = 0; s < 2; ++s) {
    const StepStats x = first.Step(), y = second.Step();
    EXPECT_EQ(x.loss, y.loss) << "step " << s;
  }
  world->Barrier();
  if (world->rank() == 0) fs::remove_all(dir);
}

TEST(Trainer, RefusesWhatItCannotRunByName) {
  const SyntheticTokens data(256, /*seed=*/3);
  Gpt a(Tiny());
  TrainerOptions o = Options();
  o.engine.seq_len = 0;
  try {
    Trainer t(a, data, o);
    ADD_FAILURE() << "seq_len 0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TrainerOptions::engine.seq_len"), std::string::npos)
        << e.what();
  }
  o = Options();
  Trainer t(a, data, o);
  EXPECT_THROW(t.Save(), ConfigError);  // no ckpt_dir
}

}  // namespace
}  // namespace sshsdp
