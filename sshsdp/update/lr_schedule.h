// Learning-rate schedules: linear warm-up, then constant, cosine decay, or warm-up–stable–decay
// (WSD), as a multiplier of the peak learning rate. One schedule drives AdamW's and Muon's
// learning rates alike (each its own peak, both decaying to the same fraction min_ratio).
//
//   LrSchedule s = LrSchedule::Parse("cosine");
//   s.warmup = 100; s.total = 5000; s.min_ratio = 0.1;  // --lr-min = lr / 10
//   engine.SetLearningRate(lr * s.Factor(step));        // step 0-based
//
// The schedule depends only on the step and its fields, so a resumed run that restores them
// (the checkpoint records the run's options) continues it exactly.
#pragma once

#include <cstdint>
#include <string>

namespace sshsdp {

struct LrSchedule {
  enum class Kind { kConstant, kCosine, kWsd };
  Kind kind = Kind::kConstant;
  int64_t warmup = 0;    // steps 0..warmup-1 ramp linearly: (step + 1) / warmup
  int64_t total = 0;     // the run's steps: the decay ends at total - 1
  double min_ratio = 0;  // cosine / WSD end at peak · min_ratio
  int64_t decay = 0;     // WSD: the last `decay` steps decay linearly (0: 20 % of total)

  // "constant" | "cosine" | "wsd"; ConfigError naming the choices otherwise.
  static Kind Parse(const std::string& name);
  // ConfigError naming the option (--warmup, --steps, --lr-min, --decay-steps) when the
  // fields cannot make a schedule.
  void Validate() const;
  // Multiplier of the peak learning rate at 0-based step `step`, in [0, 1].
  double Factor(int64_t step) const;
  // WSD's decay length after the 20 % default.
  int64_t DecaySteps() const;
};

}  // namespace sshsdp
