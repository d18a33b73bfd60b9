// A step whose loss or gradient norm is not finite, on every layout of the world size:
// kStop throws NonFiniteError on every rank before anything is applied; kSkip leaves the
// weights (bit for bit), the optimizer state and the step count as they were — checked by
// training on afterwards and comparing with an engine that never saw the bad step.
// StateIsFinite finds a non-finite main weight or optimizer moment on any one rank.
// ValidateEngineConfig refuses bad hyperparameters, naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/testing/parity_harness.h"

namespace sshsdp {
namespace {

using testing::Layout;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Fixture {
  Fixture(const Layout& l, NonFinitePolicy policy)
      : world(MpiCommunicator::World(l.rpn)),
        model(testing::TestGpt()),
        cfg(Config(l, policy)),
        engine(model, *world, cfg) {
    engine.InitWeights(7);
  }
  static EngineConfig Config(const Layout& l, NonFinitePolicy policy) {
    EngineConfig c = testing::BaseConfig(l, 2, DType::kBF16);
    c.on_nonfinite = policy;
    return c;
  }
  StepStats Step() {
    BatchFn b = testing::MakeBatch(&data_step, cfg.microbatches, world->size(), world->rank(),
                                   cfg.batch_size, cfg.seq_len, testing::TestGpt().vocab);
    StepStats st = engine.Step(b);
    ++data_step;
    return st;
  }
  std::unique_ptr<Communicator> world;
  Gpt model;
  EngineConfig cfg;
  Engine engine;
  int64_t data_step = 0;
};

bool BitEqual(const std::map<std::string, std::vector<float>>& a,
              const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, v] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.size() != v.size() ||
        std::memcmp(it->second.data(), v.data(), v.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// The initial weights with one element of the first tensor replaced by NaN.
std::map<std::string, std::vector<float>> Poisoned(std::map<std::string, std::vector<float>> w) {
  w.begin()->second[w.begin()->second.size() / 2] = kNaN;
  return w;
}

TEST(EngineNonFinite, StopThrowsOnEveryRankBeforeApplying) {
  for (const Layout& l : testing::LayoutsFor(testing::WorldSize())) {
    SCOPED_TRACE(testing::Describe(testing::WorldSize(), l));
    Fixture f(l, NonFinitePolicy::kStop);
    f.engine.LoadMainWeights(Poisoned(f.engine.GatherMainWeights()));
    const auto before = f.engine.GatherMainWeights();
    try {
      f.Step();
      FAIL() << "a NaN loss was not detected";
    } catch (const NonFiniteError& e) {
      EXPECT_NE(std::string(e.what()).find("step 1: non-finite loss or gradient norm"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("--on-nonfinite skip"), std::string::npos);
    }
    EXPECT_EQ(f.engine.step(), 0);
    EXPECT_TRUE(BitEqual(f.engine.GatherMainWeights(), before));
  }
}

TEST(EngineNonFinite, SkipLeavesWeightsStateAndStepAsTheyWere) {
  for (const Layout& l : testing::LayoutsFor(testing::WorldSize())) {
    SCOPED_TRACE(testing::Describe(testing::WorldSize(), l));
    Fixture skipped(l, NonFinitePolicy::kSkip), clean(l, NonFinitePolicy::kSkip);
    const auto good = skipped.engine.GatherMainWeights();
    ASSERT_TRUE(BitEqual(good, clean.engine.GatherMainWeights()));
    skipped.engine.LoadMainWeights(Poisoned(good));
    const auto poisoned = skipped.engine.GatherMainWeights();
    const StepStats bad = skipped.Step();
    EXPECT_TRUE(bad.skipped);
    EXPECT_FALSE(std::isfinite(bad.loss) && std::isfinite(bad.grad_norm));
    EXPECT_EQ(skipped.engine.step(), 0);
    EXPECT_TRUE(BitEqual(skipped.engine.GatherMainWeights(), poisoned));
    // Back to the good weights: the next steps equal those of an engine that never saw the
    // bad one (same data), so the skip touched neither the moments nor the step count.
    skipped.engine.LoadMainWeights(good);
    skipped.data_step = 0;
    for (int s = 0; s < 2; ++s) {
      const StepStats a = skipped.Step(), b = clean.Step();
      EXPECT_FALSE(a.skipped);
      EXPECT_EQ(a.loss, b.loss);
      EXPECT_EQ(a.grad_norm, b.grad_norm);
    }
    EXPECT_EQ(skipped.engine.step(), 2);
    EXPECT_TRUE(BitEqual(skipped.engine.GatherMainWeights(), clean.engine.GatherMainWeights()));
  }
}

TEST(EngineNonFinite, StateIsFiniteSeesEveryRank) {
  for (const Layout& l : testing::LayoutsFor(testing::WorldSize())) {
    SCOPED_TRACE(testing::Describe(testing::WorldSize(), l));
    Fixture f(l, NonFinitePolicy::kStop);
    EXPECT_TRUE(f.engine.StateIsFinite());
    f.Step();
    EXPECT_TRUE(f.engine.StateIsFinite());
    // An infinite learning rate turns the main weights non-finite at the next update while
    // that step's loss is still finite: only the state check sees it.
    f.engine.SetLearningRate(std::numeric_limits<float>::infinity());
    const StepStats st = f.Step();
    EXPECT_FALSE(st.skipped);
    EXPECT_FALSE(f.engine.StateIsFinite());
  }
}

TEST(EngineNonFinite, BadHyperparametersAreRefusedByName) {
  const Layout one = testing::kOneRank;
  auto refused = [&](auto edit, const char* needle) {
    EngineConfig c = testing::BaseConfig(one, 1, DType::kBF16);
    edit(c);
    try {
      ValidateEngineConfig(c);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused([](EngineConfig& c) { c.adamw.lr = kNaN; }, "AdamW lr (--lr)");
  refused([](EngineConfig& c) { c.adamw.lr = -1; }, "AdamW lr (--lr)");
  refused([](EngineConfig& c) { c.adamw.beta1 = 1.5f; }, "beta1 (--beta1) must lie in [0, 1)");
  refused([](EngineConfig& c) { c.adamw.beta2 = 1; }, "beta2 (--beta2)");
  refused([](EngineConfig& c) { c.adamw.eps = -1; }, "eps (--eps)");
  refused([](EngineConfig& c) { c.adamw.weight_decay = kNaN; }, "--weight-decay");
  refused([](EngineConfig& c) { c.clip_norm = -1; }, "(--clip)");
  refused([](EngineConfig& c) { c.muon.lr = kNaN; }, "(--muon-lr)");
  refused([](EngineConfig& c) { c.muon.momentum = 1; }, "(--muon-momentum)");
  refused([](EngineConfig& c) { c.muon.ns_steps = 0; }, "(--muon-ns-steps)");
  refused([](EngineConfig& c) { c.microbatches = 0; }, "(--microbatches)");
  refused([](EngineConfig& c) { c.seq_len = -8; }, "(--seq-len)");
  EXPECT_NO_THROW(ValidateEngineConfig(testing::BaseConfig(one, 1, DType::kBF16)));
  EXPECT_EQ(ParseNonFinitePolicy("skip"), NonFinitePolicy::kSkip);
  EXPECT_THROW(ParseNonFinitePolicy("ignore"), ConfigError);
}

}  // namespace
}  // namespace sshsdp
