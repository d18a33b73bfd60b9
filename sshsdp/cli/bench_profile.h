// The step profile of `sshsdp bench --profile`: where a configuration's step goes, by kernel
// category inside the model's forward and backward (OpProfile: GEMMs, attention, norms,
// activations, loss, embedding, elementwise, MoE routing) and by the engine's own time split
// around them (exposed communication, copies / casts / adds, optimizer, other), in ms per step
// and as shares of the step. What `bench/peers/fsdp2_peer.py --profile` prints for PyTorch,
// category for category, so the two can sit side by side.
//
//   StepProfile p{step_s, time, kernels};   // kernels: seconds per step by OpCategory
//   fmt::print("{}", StepProfileTable({{"sshsdp", p}}));
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "sshsdp/base/op_profile.h"
#include "sshsdp/engine/redundancy.h"

namespace sshsdp {

struct StepProfile {
  double step_s = 0;  // the split's sum: mean over ranks and timed steps (not the median step)
  TimeSplit time;     // the engine's split of that step
  std::array<double, kOpCategories> kernels{};  // model kernels by category, s per step
  bool profiled = false;                        // false: the model keeps no OpProfile
};

// A table, one row per configuration: ms per step and % of the step per category; the
// model's time outside any category shows as "compute, other".
std::string StepProfileTable(const std::vector<std::pair<std::string, StepProfile>>& rows);

// {"step_s", "profiled", "seconds": {category: s per step}} for the bench JSON; the
// categories are the table's columns and add up to step_s.
nlohmann::json StepProfileJson(const StepProfile& p);

}  // namespace sshsdp
