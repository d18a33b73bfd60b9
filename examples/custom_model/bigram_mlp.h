// BigramMlp: a model the repository does not have — a bigram SwiGLU MLP language model, not a
// GPT — written against sshsdp's public headers only (sshsdp/sshsdp.h).
//
// The model (V tokens, width d, hidden h): x = emb[token]; x += W_out·swiglu(W_gate·x, W_up·x);
// logits = head · rmsnorm(x); mean cross-entropy of the next token. Three runtime groups
// (what the engine gathers and frees as a unit): {emb}, {mlp.in, mlp.out}, {norm.g, head}.
// The runtime parameter mlp.in is ONE packed [2h, d] tensor — both projections in one buffer,
// one gather — holding TWO update parameters, mlp.gate and mlp.up: AdamW treats them alike,
// per-matrix Muon orthogonalises the packed [2h, d] unit, per-head Muon would treat gate and up
// as two matrices. The model never sees a shard: the engine hands it views of whole runtime
// parameters, and it computes through the backend's ops.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/sshsdp.h"

namespace bigram {

using namespace sshsdp;

constexpr int V = 64, D = 32, H = 48;

// Every op runs on the Backend the model is given (backend/backend.h) — the engine's, so the
// model's activations and the engine's buffers live in the same memory — and the model keeps
// its activations there in one allocation with a table of offsets (llm.c). On the CPU backend
// the ops are sshsdp's kernels; a backend that has the same ops runs the same model.
class BigramMlp final : public Model {
 public:
  explicit BigramMlp(Backend& b)
      : b_(b), acts_(b), onehot_(b), onehot16_(b), gain_(b), dgain_(b), loss_(b) {}

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
    std::vector<float> onehot(n_ * V, 0.0f);  // row i: token i (the embedding as a GEMM)
    for (int64_t i = 0; i < n_; ++i) {
      SSHSDP_CHECK(tokens[i] >= 0 && tokens[i] < V && targets[i] >= 0 && targets[i] < V,
                   ConfigError, "bigram MLP: token {} / target {} outside the vocabulary of {}",
                   tokens[i], targets[i], V);
      onehot[i * V + tokens[i]] = 1.0f;
    }
    std::vector<bf16> onehot16(onehot.size());  // exact: 0 and 1
    FloatToBf16(onehot.data(), onehot16.data(), onehot.size());
    b_.CopyIn(onehot_.Reserve<float>(n_ * V), onehot.data(), onehot.size() * 4);
    b_.CopyIn(onehot16_.Reserve<bf16>(n_ * V), onehot16.data(), onehot16.size() * 2);
    // Activations: one allocation, the table of offsets below.
    const int64_t sizes[] = {n_ * D, n_ * D, n_ * D, n_ * D, n_ * D, n_ * H, n_ * H,
                             n_ * H, n_ * H, n_ * V, n_ * V, n_,     n_,     n_};
    float** slots[] = {&x0_, &x1_, &xn_, &dx_, &dxn_,  &h1_,     &h3_,
                       &a_,  &da_, &p_,  &dl_, &rstd_, &losses_, &tgt_f_};
    int64_t total = 0;
    for (int64_t n : sizes) total += (n + 15) / 16 * 16;
    float* at = acts_.Reserve<float>(total);
    for (size_t i = 0; i < std::size(slots); ++i) {
      *slots[i] = at;
      at += (sizes[i] + 15) / 16 * 16;
    }
    b_.CopyIn(tgt_f_, targets, static_cast<size_t>(n_) * 4);  // int32 targets in their slot
  }

  void Forward(int g, const std::vector<TensorRef>& w) override {
    if (g == 0) {  // x0 = onehot · emb: the rows of the batch's tokens
      if (w[0].dtype == DType::kF32) {
        b_.Gemm(false, false, n_, D, V, onehot_.data<float>(), static_cast<const float*>(w[0].data),
                x0_, false);
      } else {
        b_.GemmBf16(false, false, n_, D, V, onehot16_.data<bf16>(),
                    static_cast<const bf16*>(w[0].data), x0_, false);
      }
    } else if (g == 1) {
      b_.LinearForward(x0_, Weight(w[0]), h1_, n_, H, D);
      b_.LinearForward(x0_, Weight(w[0], H * D), h3_, n_, H, D);
      b_.SwigluForward(h1_, h3_, a_, n_ * H);
      b_.LinearForward(a_, Weight(w[1]), x1_, n_, D, H);
      b_.Add(x1_, x0_, x1_, n_ * D);  // residual
    } else {
      b_.RmsNormForward(x1_, Gain(w[0]), xn_, rstd_, n_, D, /*eps=*/1e-5f);
      b_.LinearForward(xn_, Weight(w[1]), p_, n_, V, D);
      b_.SoftmaxCrossEntropyForward(p_, Targets(), losses_, n_, V, V, loss_.Reserve<double>(1));
    }
  }
  double Loss() const override {
    double sum = 0.0;
    b_.CopyOut(&sum, loss_.data<double>(), sizeof(double));
    return sum / static_cast<double>(n_);
  }

  void Backward(int g, const std::vector<TensorRef>& w, const std::vector<TensorRef>& grad,
                GradWrite mode) override {
    const bool acc = mode == GradWrite::kAccumulate;
    for (const TensorRef& t : grad)
      SSHSDP_CHECK(t.dtype == DType::kF32, ConfigError, "bigram MLP: fp32 gradients only");
    if (g == 2) {
      b_.SoftmaxCrossEntropyBackward(p_, Targets(), dl_, n_, V, static_cast<float>(1.0 / n_));
      b_.LinearBackwardWeight(dl_, xn_, Compute(w[1]), grad[1].data, DType::kF32, n_, V, D, acc);
      b_.LinearBackwardData(dl_, Weight(w[1]), dxn_, n_, V, D, false);
      float* dg = dgain_.Reserve<float>(D);
      b_.RmsNormBackward(dxn_, x1_, Gain(w[0]), rstd_, dx_, dg, n_, D, /*accumulate_dx=*/false);
      b_.WriteOrAccumulate(dg, grad[0].data, DType::kF32, D, acc);
    } else if (g == 1) {
      // dx_ holds dL/dx1; x1 = x0 + a·W_outᵀ, so dL/dx0 = dx1 + (gate and up paths).
      b_.LinearBackwardWeight(dx_, a_, Compute(w[1]), grad[1].data, DType::kF32, n_, D, H, acc);
      b_.LinearBackwardData(dx_, Weight(w[1]), da_, n_, D, H, false);
      b_.SwigluBackward(h1_, h3_, da_, h1_, h3_, n_ * H);
      float* dgate = static_cast<float*>(grad[0].data);  // mlp.in's gradient: [gate; up]
      b_.LinearBackwardWeight(h1_, x0_, Compute(w[0]), dgate, DType::kF32, n_, H, D, acc);
      b_.LinearBackwardWeight(h3_, x0_, Compute(w[0]), dgate + H * D, DType::kF32, n_, H, D, acc);
      b_.LinearBackwardData(h1_, Weight(w[0]), dx_, n_, H, D, true);
      b_.LinearBackwardData(h3_, Weight(w[0], H * D), dx_, n_, H, D, true);
    } else {  // demb = onehotᵀ · dx: rows that never occur get explicit zeros
      b_.Gemm(true, false, V, D, n_, onehot_.data<float>(), dx_, static_cast<float*>(grad[0].data),
              acc);
    }
  }

  double FlopsPerToken() const override { return 6.0 * (3.0 * H * D + V * D); }
  int64_t ActivationBytes() const override {
    return acts_.bytes() + onehot_.bytes() + onehot16_.bytes();
  }

 private:
  // A weight view from element `offset` of a runtime weight (fp32 or bf16).
  static kernels::WeightView Weight(const TensorRef& t, int64_t offset = 0) {
    return {static_cast<const char*>(t.data) + offset * static_cast<int64_t>(DTypeSize(t.dtype)),
            t.dtype};
  }
  static DType Compute(const TensorRef& t) { return kernels::LinearComputeDType(t.dtype); }
  const float* Gain(const TensorRef& t) {
    if (t.dtype == DType::kF32) return static_cast<const float*>(t.data);
    float* g = gain_.Reserve<float>(D);
    b_.CastBf16ToF32(static_cast<const bf16*>(t.data), g, D);
    return g;
  }
  const int32_t* Targets() const { return reinterpret_cast<const int32_t*>(tgt_f_); }

  Backend& b_;
  BackendBuffer acts_, onehot_, onehot16_, gain_, dgain_, loss_;
  int64_t n_ = 0;
  float *x0_ = nullptr, *x1_ = nullptr, *xn_ = nullptr, *dx_ = nullptr, *dxn_ = nullptr,
        *h1_ = nullptr, *h3_ = nullptr, *a_ = nullptr, *da_ = nullptr, *p_ = nullptr,
        *dl_ = nullptr, *rstd_ = nullptr, *losses_ = nullptr, *tgt_f_ = nullptr;
};

}  // namespace bigram
