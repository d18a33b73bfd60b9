// Fixtures shared by the MoE GPT tests (moe_test, moe_routing_test, moe_gradients_test): the
// tiny two-block config they all start from and the routing of every MoE block, so each test
// binary builds the same model without repeating it.
#pragma once

#include <cstdint>
#include <vector>

#include "sshsdp/models/moe.h"

namespace sshsdp::testing {

// Block 0 dense, block 1 MoE (4 experts of width 12, top-2, shared expert of width 8).
inline MoeConfig TinyConfig() {
  MoeConfig c;
  c.trunk.vocab = 32;
  c.trunk.seq_len = 8;
  c.trunk.d_model = 16;
  c.trunk.n_head = 2;
  c.trunk.n_layer = 2;
  c.n_expert = 4;
  c.top_k = 2;
  c.d_expert = 12;
  c.moe_every = 2;
  c.shared_expert = true;
  c.d_shared = 8;
  c.aux_loss_weight = 0.1f;  // large enough that its gradient is well above fp32 noise
  return c;
}

inline std::vector<std::vector<int32_t>> AllRouting(const MoeGpt& m) {
  std::vector<std::vector<int32_t>> r;
  for (int l = 0; l < m.config().trunk.n_layer; ++l) {
    if (m.config().IsMoeLayer(l)) r.push_back(m.Routing(l));
  }
  return r;
}

}  // namespace sshsdp::testing
