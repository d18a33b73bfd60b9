// Learning-rate schedules against their closed forms: warm-up ramp, cosine end points and
// midpoint, WSD's stable phase and linear decay to the floor, and refused settings.
#include "sshsdp/update/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

TEST(LrSchedule, WarmupThenConstant) {
  LrSchedule s;
  s.warmup = 4;
  s.total = 10;
  EXPECT_DOUBLE_EQ(s.Factor(0), 0.25);
  EXPECT_DOUBLE_EQ(s.Factor(3), 1.0);
  EXPECT_DOUBLE_EQ(s.Factor(9), 1.0);
}

TEST(LrSchedule, CosineDecaysFromPeakToFloor) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::kCosine;
  s.warmup = 10;
  s.total = 111;  // decay over steps 10..110
  s.min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(s.Factor(4), 0.5);
  EXPECT_DOUBLE_EQ(s.Factor(10), 1.0);                // first step after warm-up: peak
  EXPECT_NEAR(s.Factor(60), 0.1 + 0.5 * 0.9, 1e-12);  // halfway: cos(π/2) = 0
  EXPECT_NEAR(s.Factor(110), 0.1, 1e-12);             // last step: the floor
  EXPECT_NEAR(s.Factor(35), 0.1 + 0.5 * (1 + std::cos(std::numbers::pi * 0.25)) * 0.9, 1e-12);
  for (int64_t t = 11; t < 111; ++t) EXPECT_LT(s.Factor(t), s.Factor(t - 1)) << t;
  EXPECT_NEAR(s.Factor(500), 0.1, 1e-12);  // beyond the horizon: stays at the floor
}

TEST(LrSchedule, WsdIsStableThenDecaysLinearly) {
  LrSchedule s;
  s.kind = LrSchedule::Kind::kWsd;
  s.warmup = 2;
  s.total = 20;  // default decay: 4 steps, 16..19
  s.min_ratio = 0.0;
  EXPECT_EQ(s.DecaySteps(), 4);
  EXPECT_DOUBLE_EQ(s.Factor(1), 1.0);
  EXPECT_DOUBLE_EQ(s.Factor(15), 1.0);
  EXPECT_DOUBLE_EQ(s.Factor(16), 0.75);
  EXPECT_DOUBLE_EQ(s.Factor(18), 0.25);
  EXPECT_DOUBLE_EQ(s.Factor(19), 0.0);
  s.decay = 10;
  s.min_ratio = 0.5;
  EXPECT_DOUBLE_EQ(s.Factor(9), 1.0);
  EXPECT_DOUBLE_EQ(s.Factor(19), 0.5);
}

TEST(LrSchedule, RefusesWhatCannotBeASchedule) {
  EXPECT_EQ(LrSchedule::Parse("cosine"), LrSchedule::Kind::kCosine);
  EXPECT_THROW(LrSchedule::Parse("linear"), ConfigError);
  LrSchedule s;
  s.kind = LrSchedule::Kind::kWsd;
  s.total = 10;
  s.warmup = 5;
  s.decay = 6;
  EXPECT_THROW(s.Validate(), ConfigError);
  s.decay = 5;
  EXPECT_NO_THROW(s.Validate());
  s.min_ratio = 1.5;
  EXPECT_THROW(s.Validate(), ConfigError);
}

}  // namespace
}  // namespace sshsdp
