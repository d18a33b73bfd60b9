// GroupOrder: the order a model's runtime groups run in, checked — Forward 0..n-1 (group 0
// starts a new pass), then Backward n-1..0 after a whole forward (and again, activations being
// untouched by backward). PlanError naming the model and what was expected otherwise. Gpt and
// MoeGpt keep one each.
//
//   GroupOrder order("GPT");
//   order.Reset(n);                // SetBatch: n groups, nothing run
//   order.StartForward(g);  ...; order.EndForward(g);
//   order.StartBackward(g); ...; order.EndBackward(g);
#pragma once

#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {

class GroupOrder {
 public:
  explicit GroupOrder(const char* model) : model_(model) {}

  void Reset(int groups) {
    groups_ = groups;
    next_fwd_ = 0;
    done_ = false;
    next_bwd_ = -1;
  }
  void StartForward(int g) {
    SSHSDP_CHECK(g == 0 || g == next_fwd_, PlanError,
                 "{} Forward({}) out of order: expected group {} (forward runs 0..{})", model_, g,
                 next_fwd_, groups_ - 1);
    if (g == 0) done_ = false, next_bwd_ = -1;
  }
  void EndForward(int g) {
    next_fwd_ = g + 1;
    if (next_fwd_ == groups_) done_ = true, next_bwd_ = groups_ - 1;
  }
  void StartBackward(int g) const {
    SSHSDP_CHECK(done_ && g == next_bwd_, PlanError,
                 "{} Backward({}) out of order: {} (backward runs {}..0 after a full forward)",
                 model_, g,
                 done_ ? fmt::format("expected group {}", next_bwd_)
                       : std::string("forward pass incomplete"),
                 groups_ - 1);
  }
  void EndBackward(int g) { next_bwd_ = g == 0 ? groups_ - 1 : g - 1; }
  // The last group's Forward ran since the pass began.
  bool forward_done() const { return done_; }

 private:
  const char* model_;
  int groups_ = 0, next_fwd_ = 0, next_bwd_ = -1;
  bool done_ = false;
};

}  // namespace sshsdp
