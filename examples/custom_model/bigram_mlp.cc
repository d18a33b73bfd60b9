// Bring your own model: a model the repository does not have — a bigram SwiGLU MLP language
// model, not a GPT — written against sshsdp's public headers only and trained by the installed
// library on several ranks, with AdamW and with per-matrix Muon, each checked step by step
// against the same engine on one rank (the paper's correctness method), then checkpointed.
//
//   mpirun -np 3 build/bigram_mlp out/ckpt       (any world size; exits non-zero on a mismatch)
//
// The model (V tokens, width d, hidden h): x = emb[token]; x += W_out·swiglu(W_gate·x, W_up·x);
// logits = head · rmsnorm(x); mean cross-entropy of the next token. Three runtime groups
// (what the engine gathers and frees as a unit): {emb}, {mlp.in, mlp.out}, {norm.g, head}.
// The runtime parameter mlp.in is ONE packed [2h, d] tensor — both projections in one buffer,
// one gather — holding TWO update parameters, mlp.gate and mlp.up: AdamW treats them alike,
// per-matrix Muon (--muon-unit matrix) orthogonalises the packed [2h, d] unit, per-head Muon
// would treat gate and up as two matrices. The model never sees a shard: the engine hands it
// views of whole runtime parameters.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/ckpt/checkpoint.h"
#include "sshsdp/comm/mpi_communicator.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/engine/engine.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/models/data.h"
#include "sshsdp/models/layers.h"

namespace {

using namespace sshsdp;

constexpr int V = 64, D = 32, H = 48;

class BigramMlp final : public Model {
 public:
  int num_groups() const override { return 3; }

  std::vector<RuntimeParamSpec> GroupParams(int g) const override {
    auto normal = [](float std) { return InitSpec{InitSpec::Kind::kNormal, std}; };
    if (g == 0) return {layers::Single("emb", {V, D}, UpdateKind::kEmbedding, normal(0.5f))};
    if (g == 1) {
      RuntimeParamSpec in{"mlp.in", {2 * H, D}, {}};
      in.parts.push_back({"mlp.gate", {H, D}, 0, UpdateKind::kMatrix, normal(0.2f)});
      in.parts.push_back({"mlp.up", {H, D}, H * D, UpdateKind::kMatrix, normal(0.2f)});
      return {in, layers::Single("mlp.out", {D, H}, UpdateKind::kMatrix, normal(0.05f))};
    }
    return {layers::Single("norm.g", {D}, UpdateKind::kVector, layers::kOnes),
            layers::Single("head", {V, D}, UpdateKind::kEmbedding, normal(0.1f))};
  }

  void SetBatch(const int32_t* tokens, const int32_t* targets, int B, int T) override {
    n_ = static_cast<int64_t>(B) * T;
    tok_.assign(tokens, tokens + n_);
    tgt_.assign(targets, targets + n_);
    for (int64_t i = 0; i < n_; ++i)
      SSHSDP_CHECK(tok_[i] >= 0 && tok_[i] < V && tgt_[i] >= 0 && tgt_[i] < V, ConfigError,
                   "bigram MLP: token {} / target {} outside the vocabulary of {}", tok_[i],
                   tgt_[i], V);
    for (auto* v : {&x0_, &x1_, &xn_, &dx_, &dxn_}) v->assign(n_ * D, 0.0f);
    for (auto* v : {&h1_, &h3_, &a_, &da_}) v->assign(n_ * H, 0.0f);
    for (auto* v : {&p_, &dl_}) v->assign(n_ * V, 0.0f);
    rstd_.assign(n_, 0.0f);
    losses_.assign(n_, 0.0f);
  }

  void Forward(int g, const std::vector<TensorRef>& w) override {
    if (g == 0) {
      for (int64_t i = 0; i < n_; ++i) layers::LoadRow(w[0], tok_[i], D, &x0_[i * D]);
    } else if (g == 1) {
      kernels::LinearForward(x0_.data(), w[0].data, w[0].dtype, h1_.data(), n_, H, D);
      kernels::LinearForward(x0_.data(), Row(w[0], H * D), w[0].dtype, h3_.data(), n_, H, D);
      layers::SwigluForward(h1_.data(), h3_.data(), a_.data(), n_ * H);
      kernels::LinearForward(a_.data(), w[1].data, w[1].dtype, x1_.data(), n_, D, H);
      kernels::Add(x1_.data(), x0_.data(), x1_.data(), n_ * D);  // residual
    } else {
      layers::RmsNormForward(x1_.data(), Gain(w[0]), xn_.data(), rstd_.data(), n_, D);
      kernels::LinearForward(xn_.data(), w[1].data, w[1].dtype, p_.data(), n_, V, D);
      loss_ = layers::SoftmaxCrossEntropyForward(p_.data(), tgt_.data(), losses_.data(), n_, V, V) /
              static_cast<double>(n_);
    }
  }
  double Loss() const override { return loss_; }

  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override {
    const bool acc = mode == GradWrite::kAccumulate;
    for (const TensorRef& t : grad)
      SSHSDP_CHECK(t.dtype == DType::kF32, ConfigError, "bigram MLP: fp32 gradients only");
    if (g == 2) {
      layers::SoftmaxCrossEntropyBackward(p_.data(), tgt_.data(), dl_.data(), n_, V,
                                          static_cast<float>(1.0 / n_));
      kernels::LinearBackwardWeight(dl_.data(), xn_.data(), w[1].dtype, grad[1].data, DType::kF32,
                                    n_, V, D, acc);
      kernels::LinearBackwardData(dl_.data(), w[1].data, w[1].dtype, dxn_.data(), n_, V, D, false);
      std::vector<float> dg(D);
      layers::RmsNormBackward(dxn_.data(), x1_.data(), Gain(w[0]), rstd_.data(), dx_.data(),
                              dg.data(), n_, D, /*accumulate_dx=*/false);
      kernels::WriteOrAccumulate(dg.data(), grad[0].data, DType::kF32, D, acc);
    } else if (g == 1) {
      // dx_ holds dL/dx1; x1 = x0 + a·W_outᵀ, so dL/dx0 = dx1 + (gate and up paths).
      kernels::LinearBackwardWeight(dx_.data(), a_.data(), w[1].dtype, grad[1].data, DType::kF32,
                                    n_, D, H, acc);
      kernels::LinearBackwardData(dx_.data(), w[1].data, w[1].dtype, da_.data(), n_, D, H, false);
      layers::SwigluBackward(h1_.data(), h3_.data(), da_.data(), h1_.data(), h3_.data(), n_ * H);
      float* dgate = static_cast<float*>(grad[0].data);  // mlp.in's gradient: [gate; up]
      kernels::LinearBackwardWeight(h1_.data(), x0_.data(), w[0].dtype, dgate, DType::kF32, n_, H,
                                    D, acc);
      kernels::LinearBackwardWeight(h3_.data(), x0_.data(), w[0].dtype, dgate + H * D, DType::kF32,
                                    n_, H, D, acc);
      kernels::LinearBackwardData(h1_.data(), w[0].data, w[0].dtype, dx_.data(), n_, H, D, true);
      kernels::LinearBackwardData(h3_.data(), Row(w[0], H * D), w[0].dtype, dx_.data(), n_, H, D,
                                  true);
    } else {
      float* demb = static_cast<float*>(grad[0].data);
      if (!acc) kernels::Fill(demb, V * D, 0.0f);  // rows that never occur get explicit zeros
      for (int64_t i = 0; i < n_; ++i)
        for (int j = 0; j < D; ++j) demb[tok_[i] * D + j] += dx_[i * D + j];
    }
  }

  double FlopsPerToken() const override { return 6.0 * (3.0 * H * D + V * D); }
  int64_t ActivationBytes() const override {
    return static_cast<int64_t>(4 * (5 * n_ * D + 4 * n_ * H + 2 * n_ * V + 2 * n_));
  }

 private:
  // Element `offset` of a runtime weight view (fp32 or bf16).
  static const void* Row(const TensorRef& t, int64_t offset) {
    return static_cast<const char*>(t.data) + offset * static_cast<int64_t>(DTypeSize(t.dtype));
  }
  const float* Gain(const TensorRef& t) {
    gain_.resize(D);
    layers::LoadRow(t, 0, D, gain_.data());
    return gain_.data();
  }

  int64_t n_ = 0;
  double loss_ = 0.0;
  std::vector<int32_t> tok_, tgt_;
  std::vector<float> x0_, x1_, xn_, dx_, dxn_, h1_, h3_, a_, da_, p_, dl_, rstd_, losses_, gain_;
};

// Trains `steps` steps on W ranks next to the same engine on one rank with W·M microbatches
// (the same global batch), comparing loss and every main weight. Returns the number of
// mismatches.
// Weights within `weight_tol`: AdamW differs by fp32 summation order only (~1e-7); Muon's
// Newton–Schulz input u is bf16 (MuonConfig), so a rounding that differs somewhere moves v on
// weak directions (~1e-5 here) — far below the lr = 0.02 step of a wrong or missing fragment.
int TrainAndCheck(Communicator& world, const EngineConfig& base, const char* label,
                  double weight_tol, const std::string& ckpt_dir) {
  const int W = world.size(), rank = world.rank(), M = base.microbatches, B = base.batch_size;
  const int T = base.seq_len, steps = 8;
  SyntheticTokens data(V, /*seed=*/5);
  BigramMlp model, ref_model;
  EngineConfig cfg = base;
  cfg.sw = cfg.sg = cfg.so = W;  // fully sharded
  Engine engine(model, world, cfg);
  std::unique_ptr<Communicator> self = world.Split(rank, 0);
  EngineConfig ref_cfg = base;
  ref_cfg.microbatches = M * W;
  Engine ref(ref_model, *self, ref_cfg);
  engine.InitWeights(1);
  ref.InitWeights(1);
  int bad = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const StepStats st = engine.Step([&](int mb, int32_t* tok, int32_t* tgt) {
      data.Batch(SampleIndex(s, mb, M, rank, W, 0, B), B, T, tok, tgt);
    });
    const StepStats rs = ref.Step([&](int mb, int32_t* tok, int32_t* tgt) {
      data.Batch(SampleIndex(s, mb, M * W, 0, 1, 0, B), B, T, tok, tgt);
    });
    const auto a = engine.GatherMainWeights(), b = ref.GatherMainWeights();
    double worst = 0;
    for (const auto& [name, v] : a)
      for (size_t i = 0; i < v.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::abs(v[i] - b.at(name)[i])));
    const bool ok = std::abs(st.loss - rs.loss) <= 1e-5 * rs.loss && worst <= weight_tol;
    bad += !ok;
    if (rank == 0 && (s == 0 || s + 1 == steps || !ok))
      std::printf("%s step %lld: loss %.6f (one rank %.6f), worst weight difference %.2e%s\n",
                  label, static_cast<long long>(s + 1), st.loss, rs.loss, worst,
                  ok ? "" : "  MISMATCH");
  }
  PrepareCheckpointRoot(ckpt_dir);
  const SaveResult saved = SaveCheckpoint(engine, world, ckpt_dir, {});
  if (rank == 0)
    std::printf("%s: saved %s (%d files, %llu bytes)\n", label, saved.dir.c_str(), saved.files,
                static_cast<unsigned long long>(saved.bytes));
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  return RunMpiMain(argc, argv, [&] {
    const std::string root = argc > 1 ? argv[1] : "out/custom_model";
    auto world = MpiCommunicator::World(WorldSize());  // one node
    EngineConfig cfg;
    cfg.microbatches = 2;
    cfg.batch_size = 4;
    cfg.seq_len = 16;
    cfg.weight_dtype = DType::kF32;
    cfg.adamw.lr = 1e-2f;
    int bad = TrainAndCheck(*world, cfg, "adamw", 2e-5, root + "/adamw");
    cfg.optimizer = OptimizerKind::kMuon;  // matrices; AdamW for the gain and the tables
    cfg.muon_unit = UnitRule::kMatrix;     // mlp.in as one [2h, d] unit
    bad += TrainAndCheck(*world, cfg, "muon per matrix", 2e-4, root + "/muon");
    if (world->rank() == 0)
      std::printf("%s on %d ranks\n", bad == 0 ? "OK: matches the one-rank reference" : "FAILED",
                  world->size());
    return bad == 0 ? 0 : 1;
  });
}
