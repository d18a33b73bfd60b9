// Framework presets and the ablation ladder (presets.h).
#include "sshsdp/engine/presets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sshsdp/base/error.h"

namespace sshsdp {

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string> names = {"sshsdp", "fsdp2", "megatron-fsdp",
                                                 "vescale-fsdp"};
  return names;
}

void ApplyPreset(std::string_view name, EngineConfig* cfg) {
  Redundancies r;
  ShardLayout layout = ShardLayout::kFlat;
  if (name == "sshsdp") {
  } else if (name == "fsdp2") {
    r.tw_every_use = r.cast_every_gather = r.weight_copies = r.grad_copies = r.separate_add = true;
    r.structured_updates = StructuredUpdates::kFullTensor;
    r.replicate_optimizer = true;
    layout = ShardLayout::kDim0;
  } else if (name == "megatron-fsdp") {
    r.separate_add = true;
    r.structured_updates = StructuredUpdates::kUnsupported;
  } else if (name == "vescale-fsdp") {
    // No ①: the model has no packed runtime layout (PresetQkvModel).
    r.cast_every_gather = r.separate_add = r.replicate_optimizer = true;
    layout = ShardLayout::kAligned;
  } else {
    throw ConfigError(
        fmt::format("unknown preset '{}': use one of {}", name, fmt::join(PresetNames(), ", ")));
  }
  cfg->redundancies = r;
  cfg->shard_layout = layout;
}

const char* QkvModelName(QkvModel m) {
  switch (m) {
    case QkvModel::kFused:
      return "fused QKV";
    case QkvModel::kPackedPerHead:
      return "packed per-head QKV";
    case QkvModel::kPerPart:
      return "per-part QKV";
  }
  return "?";
}

QkvModel PresetQkvModel(std::string_view preset, OptimizerKind optimizer, UnitRule muon_unit) {
  if (optimizer != OptimizerKind::kMuon || muon_unit != UnitRule::kHead) return QkvModel::kFused;
  return preset == "vescale-fsdp" ? QkvModel::kPerPart : QkvModel::kPackedPerHead;
}

std::vector<std::pair<std::string, EngineConfig>> AblationLadder(const EngineConfig& base) {
  std::vector<std::pair<std::string, EngineConfig>> out;
  EngineConfig c = base;
  ApplyPreset("fsdp2", &c);
  out.emplace_back("fsdp2", c);
  auto step = [&](const char* label, auto&& change) {
    change(c);
    out.emplace_back(label, c);
  };
  step("+flat shards", [](EngineConfig& e) { e.shard_layout = ShardLayout::kFlat; });
  step("+zero-copy weights (3 off)", [](EngineConfig& e) { e.redundancies.weight_copies = false; });
  step("+direct grad writes (4 off)", [](EngineConfig& e) { e.redundancies.grad_copies = false; });
  step("+packed reuse (1 off)", [](EngineConfig& e) { e.redundancies.tw_every_use = false; });
  step("+weight reuse (2 off)", [](EngineConfig& e) { e.redundancies.cast_every_gather = false; });
  step("+fused accumulation (5 off)", [](EngineConfig& e) { e.redundancies.separate_add = false; });
  step("+outer ZeRO-1 (7 off)",
       [](EngineConfig& e) { e.redundancies.replicate_optimizer = false; });
  step("+p2p units (6 off) = sshsdp",
       [](EngineConfig& e) { e.redundancies.structured_updates = StructuredUpdates::kUnits; });
  return out;
}

}  // namespace sshsdp
