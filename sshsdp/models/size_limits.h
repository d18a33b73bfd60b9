// Bounds on a model's dimensions, checked first by GptConfig::Validate and
// LlamaConfig::Validate, before anything is sized from them: every derived size (4·d_model,
// d_model·d_ff, the tables) then fits its integer type, and no model is built for minutes
// before the memory check could refuse it. They lie far beyond published architectures
// (~128 blocks, widths ~16k, FFN widths ~60k, contexts ~1M tokens).
//
//   CheckDimensions("GPT config", {{"n_layer", n_layer, kMaxLayers}, {"d_model", d, kMaxWidth}});
#pragma once

#include <cstdint>
#include <initializer_list>

#include "sshsdp/base/error.h"

namespace sshsdp {

inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;     // d_model, a head's width
inline constexpr int64_t kMaxFfnWidth = int64_t{1} << 22;  // d_ff, an expert's width
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;    // tokens per sequence
inline constexpr int64_t kMaxHeadsOrExperts = int64_t{1} << 16;

struct DimensionLimit {
  const char* name;
  int64_t value, max;
};

// ConfigError naming the first dimension above its bound.
inline void CheckDimensions(const char* model, std::initializer_list<DimensionLimit> dims) {
  for (const DimensionLimit& d : dims)
    SSHSDP_CHECK(d.value <= d.max, ConfigError,
                 "{}: {} = {} is above sshsdp's bound of {} (far beyond any published model: "
                 "a typo or an overflowed value?)",
                 model, d.name, d.value, d.max);
}

}  // namespace sshsdp
