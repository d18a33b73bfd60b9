// AdamW as an update program (see adamw.h).
#include "sshsdp/update/adamw.h"

#include <vector>

namespace sshsdp {

UpdateProgram AdamWProgram(const AdamWConfig& cfg, Backend& backend) {
  UpdateProgram p;
  p.name = "adamw";
  p.fields = {{"main", DType::kF32, FieldRole::kState},
              {"grad", DType::kF32, FieldRole::kState},
              {"m", DType::kF32, FieldRole::kState},
              {"v", DType::kF32, FieldRole::kState}};
  const Extent one = Extent::Elements(1);
  // data = {grad, main, m, v, main, m, v}.
  UpdateStage s{"adamw",
                {{"grad", one}, {"main", one}, {"m", one}, {"v", one}},
                {{"main", one}, {"m", one}, {"v", one}},
                {"adamw.lr", "step", "grad_scale"},
                nullptr,
                nullptr};
  s.kernel = [cfg, b_ = &backend](const StageBatch& b) {
    AdamWConfig c = cfg;
    c.lr = static_cast<float>(b.scalars->Get("adamw.lr"));
    std::vector<AdamWSpan> spans;
    spans.reserve(b.items.size());
    for (const StageItem& it : b.items) {
      const float wd = it.unit->kind == UpdateKind::kVector ? 0.0f : cfg.weight_decay;
      spans.push_back({static_cast<float*>(it.data[1]), static_cast<const float*>(it.data[0]),
                       static_cast<float*>(it.data[2]), static_cast<float*>(it.data[3]), it.numel,
                       wd});
    }
    const auto step = static_cast<int64_t>(b.scalars->Get("step"));
    const auto grad_scale = static_cast<float>(b.scalars->Get("grad_scale"));
    b_->AdamW(spans.data(), static_cast<int>(spans.size()), c, step, grad_scale);
  };
  p.stages.push_back(std::move(s));
  return p;
}

}  // namespace sshsdp
