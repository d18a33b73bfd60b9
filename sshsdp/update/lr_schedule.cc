// Learning-rate schedules (lr_schedule.h). Cosine as nanoGPT / llm.c run it (warm-up, then
// min + ½(1 + cos(π·progress))·(1 − min) over the remaining steps); WSD as in MiniCPM
// (warm-up, constant, linear decay over the last steps).
#include "sshsdp/update/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "sshsdp/base/error.h"

namespace sshsdp {

LrSchedule::Kind LrSchedule::Parse(const std::string& name) {
  if (name == "constant") return Kind::kConstant;
  if (name == "cosine") return Kind::kCosine;
  if (name == "wsd") return Kind::kWsd;
  throw ConfigError(fmt::format("--lr-schedule must be constant, cosine or wsd, got '{}'", name));
}

void LrSchedule::Validate() const {
  SSHSDP_CHECK(warmup >= 0, ConfigError, "--warmup must be >= 0 steps, got {}", warmup);
  SSHSDP_CHECK(total >= 0, ConfigError, "--steps must be >= 0, got {}", total);
  SSHSDP_CHECK(std::isfinite(min_ratio) && min_ratio >= 0 && min_ratio <= 1, ConfigError,
               "--lr-min must lie between 0 and --lr (a fraction {} of it is not in [0, 1])",
               min_ratio);
  SSHSDP_CHECK(decay >= 0, ConfigError, "--decay-steps must be >= 0 (0: 20% of --steps), got {}",
               decay);
  if (kind == Kind::kWsd) {
    SSHSDP_CHECK(warmup + DecaySteps() <= total, ConfigError,
                 "--lr-schedule wsd: --warmup {} + --decay-steps {} exceed --steps {}", warmup,
                 DecaySteps(), total);
  }
}

int64_t LrSchedule::DecaySteps() const {
  return decay > 0 ? decay : static_cast<int64_t>(std::llround(0.2 * static_cast<double>(total)));
}

double LrSchedule::Factor(int64_t step) const {
  if (warmup > 0 && step < warmup)
    return static_cast<double>(step + 1) / static_cast<double>(warmup);
  switch (kind) {
    case Kind::kConstant:
      return 1.0;
    case Kind::kCosine: {
      const int64_t span = total - warmup;  // the decay's steps: warmup .. total-1
      if (span <= 1) return 1.0;
      const double progress =
          std::clamp(static_cast<double>(step - warmup) / static_cast<double>(span - 1), 0.0, 1.0);
      return min_ratio + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (1.0 - min_ratio);
    }
    case Kind::kWsd: {
      const int64_t d = DecaySteps(), start = total - d;  // decay on steps start .. total-1
      if (d <= 0 || step < start) return 1.0;
      const double progress = std::min(1.0, static_cast<double>(step - start + 1) / d);
      return 1.0 - progress * (1.0 - min_ratio);
    }
  }
  return 1.0;
}

}  // namespace sshsdp
