// OpProfile: wall time per kernel category (GEMMs, attention, norms, activations, loss, ...)
// of a model's forward and backward passes, for the step profile of `sshsdp bench --profile`.
// A context object the model is handed (Model::SetOpProfile); with none a kernel call pays one
// branch. Timing is a steady_clock read at each end of a scope: ~50 ns against kernels of
// tens of microseconds and more.
//
//   OpProfile profile;
//   model.SetOpProfile(&profile);
//   { OpScope s(&profile, OpCategory::kGemm); LinearForward(...); }
//   double gemm_s = profile.seconds(OpCategory::kGemm);
#pragma once

#include <array>
#include <chrono>

namespace sshsdp {

enum class OpCategory : int {
  kGemm,         // linear layers' products (and their bf16 rounding / widening)
  kAttention,    // causal attention forward / backward (its GEMMs included)
  kNorm,         // RMSNorm forward / backward, gain conversion and gain-gradient writes
  kActivation,   // GELU / SwiGLU
  kLoss,         // softmax cross-entropy forward / backward
  kEmbedding,    // embedding lookup and its scatter-add
  kElementwise,  // residual adds
  kRouting,      // MoE gating (router GEMMs included), auxiliary loss, permutation, combination
};
inline constexpr int kOpCategories = 8;

inline const char* OpCategoryName(OpCategory c) {
  static constexpr const char* kNames[kOpCategories] = {
      "gemm", "attention", "norm", "activation", "loss", "embedding", "elementwise", "routing"};
  return kNames[static_cast<int>(c)];
}

class OpProfile {
 public:
  void Add(OpCategory c, double seconds) { seconds_[static_cast<int>(c)] += seconds; }
  double seconds(OpCategory c) const { return seconds_[static_cast<int>(c)]; }
  double total() const {
    double t = 0.0;
    for (double s : seconds_) t += s;
    return t;
  }
  void Reset() { seconds_.fill(0.0); }

 private:
  std::array<double, kOpCategories> seconds_{};
};

// Adds the scope's wall time to `profile` (nothing when it is null).
class OpScope {
 public:
  using Clock = std::chrono::steady_clock;
  OpScope(OpProfile* profile, OpCategory c) : profile_(profile), c_(c) {
    if (profile_) t0_ = Clock::now();
  }
  ~OpScope() {
    if (profile_) profile_->Add(c_, std::chrono::duration<double>(Clock::now() - t0_).count());
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpProfile* profile_;
  OpCategory c_;
  Clock::time_point t0_{};
};

}  // namespace sshsdp
