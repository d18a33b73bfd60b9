// The loss of a model's last forward, kept on its backend: the loss op adds the batch's sum of
// token losses into Sum() (one double of backend memory), and KeepLoss copies it into a ring of
// slots on the backend, so an engine reads a step's losses with one wait instead of one per
// microbatch (params/model.h's KeepLoss / TakeLosses). The dense GPT and the Llama family
// keep their losses in one.
//
//   LossRing ring(backend);
//   b.SoftmaxCrossEntropyForward(logits, targets, losses, BT, V, ld, ring.Sum());
//   ring.Keep(BT);                         // no wait
//   std::vector<double> means = ring.Take();
#pragma once

#include <cstdint>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/backend_buffer.h"

namespace sshsdp {

class LossRing {
 public:
  // Slots kept on the backend: a full ring is read back at the next Keep (one wait per kSlots
  // microbatches).
  static constexpr int kSlots = 64;
  explicit LossRing(Backend& b);
  // The sum the loss op writes (backend memory); 0 before any forward.
  double* Sum() { return sums_.data<double>(); }
  // Sum() / tokens, read back now.
  double Mean(int64_t tokens) const;
  // Copies Sum() into the next slot on the backend; `tokens` divides it when read.
  void Keep(int64_t tokens);
  // The kept means in order, forgotten here.
  std::vector<double> Take();

 private:
  Backend& b_;
  BackendBuffer sums_;             // [0]: the last forward's; [1, 1 + kSlots): the kept ones
  std::vector<int64_t> kept_;      // tokens of each slot in use
  std::vector<double> read_back_;  // kept means read back when the ring filled
};

}  // namespace sshsdp
