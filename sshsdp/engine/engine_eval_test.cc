// Validation through the sharded engine (Engine::Evaluate), on every layout of the world size,
// for sshsdp's data path and a baseline's (fsdp2: copy-out views), with and without
// resharding after forward, on a padded vocabulary (61 -> 64):
// - the distributed evaluation equals a one-process evaluation of the same weights and
//   samples (after training steps, so the weights are not the initial ones);
// - evaluating between steps changes nothing: losses, gradient norms and counters of every
//   step and the final main weights are bit-identical to a run that never evaluates.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "sshsdp/engine/engine.h"
#include "sshsdp/engine/presets.h"
#include "sshsdp/engine/testing/parity_harness.h"

namespace sshsdp {
namespace {

using testing::Layout;

GptConfig EvalGpt() {
  GptConfig c = testing::TestGpt();
  c.vocab_multiple = 16;  // 61 real tokens, 64 table rows
  return c;
}

struct Variant {
  const char* preset;
  bool keep_gathered;
};
constexpr Variant kVariants[] = {{"sshsdp", false}, {"sshsdp", true}, {"fsdp2", false}};

testing::ParityCase Case(const Layout& l, const Variant& v, testing::Reference ref) {
  const int W = testing::WorldSize(), M = 2;
  testing::ParityCase c;
  c.layout = l;
  c.make = testing::GptOf(EvalGpt());
  c.cfg = testing::BaseConfig(l, M, DType::kBF16);
  ApplyPreset(v.preset, &c.cfg);
  c.cfg.reshard_after_forward = !v.keep_gathered;
  c.reference = ref;
  if (ref == testing::Reference::kOneRank) {
    c.ref_cfg = testing::BaseConfig(testing::kOneRank, M * W, DType::kBF16);
    c.tol = testing::AdamWTolerances(DType::kBF16);
  } else {
    c.ref_cfg = c.cfg;
    c.tol = testing::kNoneCompared;  // compared bit for bit below
  }
  c.vocab = EvalGpt().vocab;
  c.steps = 2;
  return c;
}

// `n` validation batches per rank of `rank` (of W): samples far from the training ones
// (parity_data.h); the one-rank reference with n·W batches reads the same samples.
BatchFn ValBatch(int n, int W, int rank, int B, int T) {
  static int64_t val_step = 1000;
  return testing::MakeBatch(&val_step, n, W, rank, B, T, EvalGpt().vocab);
}

TEST(EngineEvaluate, EqualsOneProcessEvaluation) {
  const int W = testing::WorldSize();
  for (const Layout& l : testing::LayoutsFor(W)) {
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(testing::Describe(W, l) + " " + v.preset + (v.keep_gathered ? " keep" : ""));
      testing::ParityRun run(Case(l, v, testing::Reference::kOneRank));
      const EngineConfig& cfg = run.cfg();
      auto evaluate = [&] {
        const double dist =
            run.engine().Evaluate(ValBatch(3, W, run.rank(), cfg.batch_size, cfg.seq_len), 3);
        const double ref =
            run.ref().Evaluate(ValBatch(3 * W, 1, 0, cfg.batch_size, cfg.seq_len), 3 * W);
        EXPECT_TRUE(std::isfinite(dist));
        EXPECT_GT(dist, 1.0);  // a real loss, not a constant: ln 61 = 4.1 at the start
        return std::pair{dist, ref};
      };
      const auto [d0, r0] = evaluate();  // identical initial weights
      EXPECT_NEAR(d0, r0, 1e-6 * r0);
      run.Run();
      const auto [d1, r1] = evaluate();  // trained weights (bf16: neighbouring roundings)
      EXPECT_NEAR(d1, r1, 2e-3 * r1);
      EXPECT_NE(d0, d1);
    }
  }
}

TEST(EngineEvaluate, ChangesNothingAboutTraining) {
  const int W = testing::WorldSize();
  for (const Layout& l : testing::LayoutsFor(W)) {
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(testing::Describe(W, l) + " " + v.preset + (v.keep_gathered ? " keep" : ""));
      testing::ParityCase c = Case(l, v, testing::Reference::kSameWorld);
      c.steps = 3;
      testing::ParityRun run(c);
      const EngineConfig& cfg = run.cfg();
      const BatchFn val = ValBatch(2, W, run.rank(), cfg.batch_size, cfg.seq_len);
      run.engine().Evaluate(val, 2);  // before the first step too
      run.Run([&](const testing::StepDiff& d) {
        EXPECT_EQ(d.dist.loss, d.ref.loss) << "step " << d.step;
        EXPECT_EQ(d.dist.grad_norm, d.ref.grad_norm) << "step " << d.step;
        EXPECT_EQ(d.dist.counters.gathers, d.ref.counters.gathers);
        EXPECT_EQ(d.dist.counters.bytes_copied, d.ref.counters.bytes_copied);
        EXPECT_EQ(d.dist.counters.runtime_comm.total(), d.ref.counters.runtime_comm.total());
        // The outer all-gathers an evaluation runs (deferred from the last update) still count
        // in the next step.
        EXPECT_EQ(d.dist.counters.update_comm.total(), d.ref.counters.update_comm.total());
        EXPECT_EQ(d.dist.counters.outer_overlapped, d.ref.counters.outer_overlapped);
        run.engine().Evaluate(val, 2);
      });
      testing::ExpectWeightsBitEqual(run.engine(), run.ref());
      EXPECT_EQ(run.engine().step(), run.ref().step());
    }
  }
}

}  // namespace
}  // namespace sshsdp
