// What the op-by-op backend tests share (backend_test.cc, typed_ops_test.cc): the backend under
// test (--backend=cpu|cuda, read by backend_test.cc's main), buffers in its memory, inputs and
// comparisons.
//
//   TEST_F(BackendTest, Op) {
//     Buffer<float> x(*b_, Values(n, 1));
//     EXPECT_EQ(FirstMismatch(x.Read(), want), "");
//   }
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "sshsdp/backend/backend.h"

namespace sshsdp {

extern std::string g_backend;  // the --backend argument: "cpu" or "cuda"

// A backend buffer of T holding a host vector's values.
template <typename T>
class Buffer {
 public:
  Buffer(Backend& b, const std::vector<T>& host) : b_(b), n_(host.size()) {
    p_ = static_cast<T*>(b_.Alloc(n_ * sizeof(T)));
    b_.CopyIn(p_, host.data(), n_ * sizeof(T));
  }
  Buffer(Backend& b, size_t n) : Buffer(b, std::vector<T>(n)) {}
  ~Buffer() { b_.Free(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() { return p_; }
  std::vector<T> Read() {
    std::vector<T> h(n_);
    b_.CopyOut(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  Backend& b_;
  size_t n_;
  T* p_;
};

// Finite values over many binades, with specials sprinkled in.
inline std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-140, 127);
  std::vector<float> v(n);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7F800001u),  // NaN, payload in the low bits
                            std::bit_cast<float>(0xFF800123u),
                            std::numeric_limits<float>::max(),
                            -3.3961e38f,  // SR may round it past the bf16 maximum (clamped)
                            std::numeric_limits<float>::denorm_min(),
                            1.0f + 0x1p-8f};  // a bf16 tie
  for (size_t i = 0; i < n; ++i) {
    v[i] = i % 37 == 5 ? specials[(i / 37) % std::size(specials)] : std::ldexp(mant(rng), exp(rng));
  }
  return v;
}

// "" when got and want hold the same bits, else the first differing element with its input
// (one GPU run must say what went wrong).
// nan_equal: any two NaNs count as equal (float results of arithmetic on NaN: a GPU returns
// its canonical NaN, x86 propagates the operand's payload).
template <typename T>
std::string FirstMismatch(const std::vector<T>& got, const std::vector<T>& want,
                          const std::vector<float>* input = nullptr, bool nan_equal = false) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) continue;
    if constexpr (std::is_same_v<T, float>) {
      if (nan_equal && std::isnan(got[i]) && std::isnan(want[i])) continue;
    }
    uint32_t g = 0, w = 0;
    std::memcpy(&g, &got[i], sizeof(T));
    std::memcpy(&w, &want[i], sizeof(T));
    std::string in;
    if (input) in = fmt::format(" input {:#010x}", std::bit_cast<uint32_t>((*input)[i]));
    return fmt::format("element {}: got {:#x}, want {:#x}{}", i, g, w, in);
  }
  return "";
}

inline std::vector<float> Normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// "" when |got - want| <= atol + rtol·|want| everywhere, else the first element that is not.
inline std::string FirstOutside(const std::vector<float>& got, const std::vector<float>& want,
                                float atol, float rtol) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])) continue;
    return fmt::format("element {}: got {:.9g}, want {:.9g}", i, got[i], want[i]);
  }
  return "";
}

class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override { b_ = MakeBackend(g_backend); }
  std::unique_ptr<Backend> b_;
};

}  // namespace sshsdp
