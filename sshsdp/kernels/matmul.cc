// oneDNN matmul behind Gemm and the linear-layer products (see matmul.h).
//
// Transposed operands are expressed as strided memory descriptors, so no operand is ever
// transposed in memory; bf16 rounding of fp32 activations happens in a process-wide scratch
// buffer. Accumulation is oneDNN's sum post-op, which reads the destination; without it the
// primitive writes the destination without reading it, so NaN-filled outputs are replaced.
#include "sshsdp/kernels/matmul.h"

#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp::kernels {
namespace {

using dt = dnnl::memory::data_type;

dt ToDnnl(DType t) {
  switch (t) {
    case DType::kF32:
      return dt::f32;
    case DType::kBF16:
      return dt::bf16;
    default:
      throw NumericsError(fmt::format(
          "matmul supports fp32 and bf16 operands, got {} (dequantize MX weights first)",
          DTypeName(t)));
  }
}

struct Key {
  bool trans_a, trans_b;
  int64_t batch, m, n, k;
  int64_t lda, ldb, ldc;  // row strides as stored
  DType ab, c;
  bool accumulate;
  float alpha;
  auto Tie() const {
    return std::tie(trans_a, trans_b, batch, m, n, k, lda, ldb, ldc, ab, c, accumulate, alpha);
  }
  bool operator<(const Key& o) const { return Tie() < o.Tie(); }
};

struct Cached {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

// Process-wide oneDNN state. Everything is used under `mu`.
struct State {
  std::mutex mu;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Cached>> cache;
  std::vector<bf16> scratch_a, scratch_b;
  std::vector<float> scratch_c;
};

State& GetState() {
  static State* state = new State();  // never destroyed: usable from static destructors
  return *state;
}

dnnl::memory::desc MatrixDesc(int64_t batch, int64_t rows, int64_t cols, bool transposed,
                              int64_t ld, dt type) {
  // Logical [rows, cols]; stored [rows, cols] row-major, or [cols, rows] when transposed,
  // with row stride ld.
  dnnl::memory::dims strides = transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  if (batch == 1) return dnnl::memory::desc({rows, cols}, type, strides);
  return dnnl::memory::desc({batch, rows, cols}, type,
                            dnnl::memory::dims{rows * cols, strides[0], strides[1]});
}

Cached& GetPrimitive(State& s, const Key& key) {
  auto it = s.cache.find(key);
  if (it != s.cache.end()) return *it->second;
  dt ab = ToDnnl(key.ab);
  dt c = ToDnnl(key.c);
  auto a_md = MatrixDesc(key.batch, key.m, key.k, key.trans_a, key.lda, ab);
  auto b_md = MatrixDesc(key.batch, key.k, key.n, key.trans_b, key.ldb, ab);
  auto c_md = MatrixDesc(key.batch, key.m, key.n, false, key.ldc, c);
  dnnl::primitive_attr attr;
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, s.engine);
    auto cached = std::make_unique<Cached>(Cached{pd, dnnl::matmul(pd)});
    return *s.cache.emplace(key, std::move(cached)).first->second;
  } catch (const dnnl::error& e) {
    throw NumericsError(fmt::format("oneDNN matmul {}x{}x{} (batch {}) {}->{} unsupported: {}",
                                    key.m, key.n, key.k, key.batch, DTypeName(key.ab),
                                    DTypeName(key.c), e.what()));
  }
}

void Execute(State& s, const Key& key, const void* a, const void* b, void* c) {
  Cached& p = GetPrimitive(s, key);
  dnnl::memory am(p.pd.src_desc(), s.engine, const_cast<void*>(a));
  dnnl::memory bm(p.pd.weights_desc(), s.engine, const_cast<void*>(b));
  dnnl::memory cm(p.pd.dst_desc(), s.engine, c);
  p.prim.execute(s.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  s.stream.wait();
}

// Gemm with the lock held. key.c is the destination dtype; key.accumulate the mode.
void GemmLocked(State& s, Key key, const void* a, const void* b, void* c) {
  SSHSDP_CHECK(key.m >= 0 && key.n >= 0 && key.k >= 0 && key.batch >= 1, NumericsError,
               "Gemm: invalid shape m={} n={} k={} batch={}", key.m, key.n, key.k, key.batch);
  ToDnnl(key.ab);
  ToDnnl(key.c);
  if (key.m == 0 || key.n == 0) return;
  SSHSDP_CHECK(
      key.lda >= (key.trans_a ? key.m : key.k) && key.ldb >= (key.trans_b ? key.k : key.n) &&
          key.ldc >= key.n &&
          (key.batch == 1 || (key.lda == (key.trans_a ? key.m : key.k) &&
                              key.ldb == (key.trans_b ? key.k : key.n) && key.ldc == key.n)),
      NumericsError,
      "Gemm: leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={} "
      "(batched products must be dense)",
      key.lda, key.ldb, key.ldc, key.m, key.n, key.k);
  const size_t esize = DTypeSize(key.c);
  if (key.k == 0) {
    if (key.accumulate) return;
    for (int64_t r = 0; r < key.batch * key.m; ++r) {
      std::fill_n(static_cast<char*>(c) + r * key.ldc * esize, key.n * esize, 0);
    }
    return;
  }
  if (key.c == DType::kBF16 && key.ab == DType::kF32) {
    // oneDNN has no f32 x f32 -> bf16 matmul: compute in fp32 and round once.
    const int64_t rows = key.batch * key.m;
    const size_t count = static_cast<size_t>(rows * key.n);
    if (s.scratch_c.size() < count) s.scratch_c.resize(count);
    float* tmp = s.scratch_c.data();
    const bool accumulate = key.accumulate;
    const int64_t ldc = key.ldc;
    key.c = DType::kF32;
    key.accumulate = false;
    key.ldc = key.n;
    Execute(s, key, a, b, tmp);
    for (int64_t r = 0; r < rows; ++r) {
      bf16* out = static_cast<bf16*>(c) + r * ldc;
      const float* in = tmp + r * key.n;
      if (accumulate) {
        for (int64_t j = 0; j < key.n; ++j) out[j] = FloatToBf16(Bf16ToFloat(out[j]) + in[j]);
      } else {
        CastToBf16(in, out, key.n);
      }
    }
    return;
  }
  Execute(s, key, a, b, c);
}

Key DenseKey(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab, DType c,
             bool accumulate, int64_t batch) {
  return Key{trans_a,         trans_b, batch, m, n,          k,   trans_a ? m : k,
             trans_b ? k : n, n,       ab,    c, accumulate, 1.0f};
}

// Rounds n fp32 values into `buf` (grown as needed) and returns it.
const bf16* ToBf16Scratch(std::vector<bf16>& buf, const float* src, int64_t n) {
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  CastToBf16(src, buf.data(), n);
  return buf.data();
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
          DType ab_dtype, void* c, DType c_dtype, bool accumulate, int64_t batch) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  GemmLocked(s, DenseKey(trans_a, trans_b, m, n, k, ab_dtype, c_dtype, accumulate, batch), a, b, c);
}

void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                 int64_t lda, const void* b, int64_t ldb, DType ab_dtype, void* c, int64_t ldc,
                 DType c_dtype, bool accumulate, float alpha) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  GemmLocked(s,
             Key{trans_a, trans_b, 1, m, n, k, lda, ldb, ldc, ab_dtype, c_dtype, accumulate, alpha},
             a, b, c);
}

void LinearForward(const float* x, const void* w, DType w_dtype, float* y, int64_t m, int64_t n,
                   int64_t k) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  const void* a = x;
  if (w_dtype == DType::kBF16) a = ToBf16Scratch(s.scratch_a, x, m * k);
  GemmLocked(s, DenseKey(false, true, m, n, k, w_dtype, DType::kF32, false, 1), a, w, y);
}

void LinearBackwardData(const float* dy, const void* w, DType w_dtype, float* dx, int64_t m,
                        int64_t n, int64_t k, bool accumulate) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  const void* a = dy;
  if (w_dtype == DType::kBF16) a = ToBf16Scratch(s.scratch_a, dy, m * n);
  GemmLocked(s, DenseKey(false, false, m, k, n, w_dtype, DType::kF32, accumulate, 1), a, w, dx);
}

void LinearBackwardWeight(const float* dy, const float* x, DType compute_dtype, void* dw,
                          DType dw_dtype, int64_t m, int64_t n, int64_t k, bool accumulate) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  const void* a = dy;
  const void* b = x;
  if (compute_dtype == DType::kBF16) {
    a = ToBf16Scratch(s.scratch_a, dy, m * n);
    b = ToBf16Scratch(s.scratch_b, x, m * k);
  } else {
    ToDnnl(compute_dtype);
  }
  GemmLocked(s, DenseKey(true, false, n, k, m, compute_dtype, dw_dtype, accumulate, 1), a, b, dw);
}

double MeasureGemmPeak(DType dtype, int64_t size, int reps) {
  SSHSDP_CHECK(size > 0 && reps > 0, NumericsError, "MeasureGemmPeak: size {} reps {}", size, reps);
  const size_t n = static_cast<size_t>(size * size);
  std::vector<char> a(n * DTypeSize(dtype)), b(n * DTypeSize(dtype));
  std::vector<float> c(n);
  // Fill with small finite values (bf16 1/8 is 0x3E00; fp32 0.125f).
  if (dtype == DType::kBF16) {
    std::fill_n(reinterpret_cast<bf16*>(a.data()), n, FloatToBf16(0.125f));
    std::fill_n(reinterpret_cast<bf16*>(b.data()), n, FloatToBf16(0.125f));
  } else {
    ToDnnl(dtype);
    std::fill_n(reinterpret_cast<float*>(a.data()), n, 0.125f);
    std::fill_n(reinterpret_cast<float*>(b.data()), n, 0.125f);
  }
  std::vector<double> seconds;
  for (int r = 0; r <= reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    Gemm(false, true, size, size, size, a.data(), b.data(), dtype, c.data(), DType::kF32, false);
    double dt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) seconds.push_back(dt_s);  // r == 0 is the warm-up (primitive creation)
  }
  std::sort(seconds.begin(), seconds.end());
  double median = seconds[seconds.size() / 2];
  return 2.0 * static_cast<double>(size) * size * size / median;
}

std::string GemmImplementation(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               DType ab_dtype, DType c_dtype) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (c_dtype == DType::kBF16 && ab_dtype == DType::kF32) c_dtype = DType::kF32;
  Cached& p = GetPrimitive(s, DenseKey(trans_a, trans_b, m, n, k, ab_dtype, c_dtype, false, 1));
  return p.pd.impl_info_str();
}

}  // namespace sshsdp::kernels
