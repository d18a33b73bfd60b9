// BackendGpt on the CPU backend against Gpt (the oracle): the same initial weights and batch
// give the same loss and gradients (fp32; GEMM calls shaped differently may sum in another
// order, hence 1e-5 relative), microbatches accumulate, and a training step applies exactly
// update/adamw.h's AdamW with the engine's clipping rule.
#include "sshsdp/models/backend_gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/models/backend_gpt_model.h"
#include "sshsdp/models/data.h"
#include "sshsdp/params/model.h"

namespace sshsdp {
namespace {

GptConfig SmallConfig() {
  GptConfig c;
  c.vocab = 200;  // padded to 256: padded logits and embedding rows are exercised
  c.seq_len = 32;
  c.d_model = 32;
  c.n_head = 4;
  c.n_layer = 2;
  return c;
}

struct Oracle {
  GptConfig c = SmallConfig();
  Gpt model{c};
  DenseParams p{model};
  Oracle() { p.Init(3); }
  // Host weights in BackendGpt's tensor order (group order), checking the names.
  std::vector<float> Weights(const BackendGpt& g) {
    std::vector<float> w;
    size_t k = 0;
    for (int gi = 0; gi < p.num_groups(); ++gi) {
      for (size_t i = 0; i < p.specs(gi).size(); ++i, ++k) {
        EXPECT_EQ(p.specs(gi)[i].name, g.tensors()[k].name);
        const auto& m = p.master(gi, static_cast<int>(i));
        w.insert(w.end(), m.begin(), m.end());
      }
    }
    EXPECT_EQ(k, g.tensors().size());
    return w;
  }
  // Loss and gradients (flat, tensor order) of one batch.
  double LossAndGrads(const int32_t* tok, const int32_t* tgt, int B, int T,
                      std::vector<float>* grads) {
    model.SetBatch(tok, tgt, B, T);
    for (int g = 0; g < model.num_groups(); ++g) model.Forward(g, p.Weights(g));
    const double loss = model.Loss();
    for (int g = model.num_groups() - 1; g >= 0; --g)
      model.Backward(g, p.Weights(g), p.Grads(g), GradWrite::kOverwrite);
    grads->clear();
    for (int g = 0; g < p.num_groups(); ++g)
      for (size_t i = 0; i < p.specs(g).size(); ++i) {
        const auto gi = p.GradAsFloat(g, static_cast<int>(i));
        grads->insert(grads->end(), gi.begin(), gi.end());
      }
    return loss;
  }
};

void Batch(int B, int T, int64_t first, std::vector<int32_t>* tok, std::vector<int32_t>* tgt) {
  SyntheticTokens src(200, 11);
  tok->resize(static_cast<size_t>(B) * T);
  tgt->resize(tok->size());
  src.Batch(first, B, T, tok->data(), tgt->data());
}

// Per tensor: max |got - want| <= rtol · max |want| (+ a floor for all-zero tensors).
void ExpectClose(const BackendGpt& g, const std::vector<float>& got, const std::vector<float>& want,
                 float rtol, const char* what) {
  for (const BackendGpt::Tensor& t : g.tensors()) {
    float amax = 0, worst = 0;
    for (int64_t i = t.offset; i < t.offset + t.size; ++i) {
      amax = std::max(amax, std::fabs(want[i]));
      worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
    EXPECT_LE(worst, rtol * amax + 1e-9f)
        << what << " " << t.name << " (max |want| " << amax << ")";
  }
}

TEST(BackendGpt, SameLossAndGradientsAsGpt) {
  Oracle o;
  auto cpu = MakeCpuBackend();
  const int B = 2, T = 16;  // T < seq_len: positions past T get zero gradients
  BackendGpt g(*cpu, o.c, B, T);
  g.LoadWeights(o.Weights(g).data());
  std::vector<int32_t> tok, tgt;
  Batch(B, T, 0, &tok, &tgt);
  std::vector<float> want;
  const double want_loss = o.LossAndGrads(tok.data(), tgt.data(), B, T, &want);
  const double loss = g.ForwardBackward(tok.data(), tgt.data(), /*accumulate=*/false);
  EXPECT_NEAR(loss, want_loss, 1e-6 * want_loss);
  std::vector<float> got(static_cast<size_t>(g.num_params()));
  g.ReadGrads(got.data());
  ExpectClose(g, got, want, 1e-5f, "gradient");
  // Accumulating the same batch again doubles every gradient.
  g.ForwardBackward(tok.data(), tgt.data(), /*accumulate=*/true);
  g.ReadGrads(got.data());
  for (float& x : want) x *= 2.0f;
  ExpectClose(g, got, want, 1e-5f, "accumulated gradient");
}

// Model::KeepLoss / TakeLosses on the backend model (the engine's one read per step): the kept
// losses come back in order, each what Loss() read after its forward, across a change of batch
// shape (a new BackendGpt) and past the ring of kept slots (one read-back when it fills), and
// are forgotten once taken.
TEST(BackendGptModel, KeptLossesComeBackInOrder) {
  auto cpu = MakeCpuBackend();
  BackendGptModel m(*cpu, SmallConfig());
  DenseParams p(m);  // host memory is the CPU backend's
  p.Init(3);
  EXPECT_THROW(m.KeepLoss(), PlanError);  // before any forward
  std::vector<double> want;
  std::vector<int32_t> tok, tgt;
  for (int i = 0; i < 3 + BackendGpt::kLossSlots + 3; ++i) {
    const int B = i < 3 ? 2 : 1, T = i < 3 ? 16 : 8;
    Batch(B, T, i * 100, &tok, &tgt);
    m.SetBatch(tok.data(), tgt.data(), B, T);
    for (int g = 0; g < m.num_groups(); ++g) m.Forward(g, p.Weights(g));
    want.push_back(m.Loss());
    m.KeepLoss();
  }
  EXPECT_EQ(m.TakeLosses(), want);
  EXPECT_TRUE(m.TakeLosses().empty());
}

TEST(BackendGpt, TrainStepIsClippedAdamW) {
  Oracle o;
  auto cpu = MakeCpuBackend();
  const int B = 2, T = 32, M = 2;
  BackendGpt a(*cpu, o.c, B, T), ref(*cpu, o.c, B, T);
  const std::vector<float> w0 = o.Weights(a);
  a.LoadWeights(w0.data());
  ref.LoadWeights(w0.data());
  std::vector<int32_t> tok, tgt;
  Batch(M * B, T, 100, &tok, &tgt);
  const AdamWConfig cfg{.lr = 1e-2f, .weight_decay = 0.1f};
  for (float clip : {0.0f, 1e-3f}) {  // off, and a clip that binds
    a.LoadWeights(w0.data());
    double norm = 0;
    const double loss = a.TrainStep(tok.data(), tgt.data(), M, cfg, clip, 1, &norm);
    // The same step by hand: summed gradients, the engine's clipping, update/adamw.h.
    const double l0 = ref.ForwardBackward(tok.data(), tgt.data(), false);
    const double l1 = ref.ForwardBackward(tok.data() + B * T, tgt.data() + B * T, true);
    EXPECT_EQ(loss, (l0 + l1) / M);
    std::vector<float> grads(static_cast<size_t>(a.num_params())), w = w0;
    ref.ReadGrads(grads.data());
    const double want_norm = std::sqrt(kernels::SumSquares(grads.data(), a.num_params())) / M;
    EXPECT_EQ(norm, want_norm);
    const double coef = clip > 0 && want_norm > clip ? clip / (want_norm + 1e-6) : 1.0;
    std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f);
    std::vector<AdamWSpan> spans;
    for (const BackendGpt::Tensor& t : a.tensors())
      spans.push_back({w.data() + t.offset, grads.data() + t.offset, m.data() + t.offset,
                       v.data() + t.offset, t.size, t.decay ? cfg.weight_decay : 0.0f});
    AdamWStep(spans, cfg, 1, static_cast<float>(coef / M));
    std::vector<float> got(w.size());
    a.ReadWeights(got.data());
    EXPECT_EQ(got, w) << "clip " << clip;
    if (clip > 0) {
      EXPECT_LT(coef, 1.0);  // the clip did bind
    }
  }
}

// A TrainStep that threw midway (a token outside the vocabulary in its second microbatch, after
// the first kept its loss) leaves nothing behind: the next step reports its own loss only.
TEST(BackendGpt, AFailedTrainStepLeavesNoKeptLoss) {
  Oracle o;
  auto cpu = MakeCpuBackend();
  const int B = 2, T = 16;
  BackendGpt a(*cpu, o.c, B, T), fresh(*cpu, o.c, B, T);
  const std::vector<float> w0 = o.Weights(a);
  a.LoadWeights(w0.data());
  fresh.LoadWeights(w0.data());
  std::vector<int32_t> tok, tgt;
  Batch(2 * B, T, 300, &tok, &tgt);
  std::vector<int32_t> bad = tok;
  bad[static_cast<size_t>(B) * T] = o.c.vocab;  // the second microbatch's first token
  const AdamWConfig cfg{.lr = 1e-2f};
  EXPECT_THROW(a.TrainStep(bad.data(), tgt.data(), 2, cfg, 0.0f, 1, nullptr), ConfigError);
  // The weights were not updated, so the same one-microbatch step gives the same loss.
  const double want = fresh.TrainStep(tok.data(), tgt.data(), 1, cfg, 0.0f, 1, nullptr);
  EXPECT_EQ(a.TrainStep(tok.data(), tgt.data(), 1, cfg, 0.0f, 1, nullptr), want);
}

TEST(BackendGpt, RefusesBadSizesAndTokens) {
  auto cpu = MakeCpuBackend();
  const GptConfig c = SmallConfig();
  EXPECT_THROW(BackendGpt(*cpu, c, 1, c.seq_len + 1), ConfigError);
  EXPECT_THROW(BackendGpt(*cpu, c, 0, 4), ConfigError);
  BackendGpt g(*cpu, c, 1, 4);
  const int32_t bad[] = {1, 2, 3, 200}, ok[] = {1, 2, 3, 4};
  EXPECT_THROW(g.ForwardBackward(bad, ok, false), ConfigError);
  EXPECT_THROW(g.TrainStep(ok, ok, 0, {}, 1.0f, 1, nullptr), ConfigError);
}

}  // namespace
}  // namespace sshsdp
