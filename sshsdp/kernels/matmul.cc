// oneDNN matmul behind Gemm and the linear-layer products (see matmul.h).
//
// Transposed operands are expressed as strided memory descriptors, so no operand is ever
// transposed in memory; bf16 rounding of fp32 activations happens in a process-wide scratch
// buffer. Accumulation is oneDNN's sum post-op, which reads the destination; without it the
// primitive writes the destination without reading it, so NaN-filled outputs are replaced.
//
// The bf16 path is probed once: a bf16 matmul primitive for a representative shape is
// created; if oneDNN refuses it (no bf16 on this ISA), only offers its reference
// implementation, or the CPU lacks bf16 instructions (AVX-512 without BF16, where oneDNN
// emulates them), bf16 products are widened by default. Widening costs one pass over each
// bf16 operand per call (O(rows·cols) against the product's O(m·n·k)); in the linear-layer
// functions an fp32 activation that the native path would round into bf16 scratch is instead
// rounded through bf16 into fp32 scratch, so it is touched once either way (a bf16 operand
// passed to Gemm / GemmStrided is widened on every call).
#include "sshsdp/kernels/matmul.h"

#include <dnnl.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/amx_gemm.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/env_choice.h"

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
  // GemmBatchedStrided: a [outer, batch] grid of products at these element strides (outer
  // and inner stride of A, B, C); outer == 0 for every other product.
  int64_t outer = 0;
  std::array<int64_t, 6> grid_strides{};
  auto Tie() const {
    return std::tie(trans_a, trans_b, batch, m, n, k, lda, ldb, ldc, ab, c, accumulate, alpha,
                    outer, grid_strides);
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
  std::vector<float> wide_a, wide_b;  // widened (or bf16-rounded) fp32 operands
  std::vector<float> pad_a;           // dy with padded rows (LinearBackwardWeight)
  std::optional<bool> native_bf16;    // probe: oneDNN runs bf16 (non-reference)
  bool hardware_bf16 = false;         // probe: the ISA has bf16 instructions
  std::optional<Bf16GemmPath> path;   // resolved on first use
  std::string probe_note;             // why the probe said no, for messages
  int64_t rounded_elements = 0;       // LinearRoundedElements
};

State& GetState() {
  static State* state = new State();  // never destroyed: usable from static destructors
  return *state;
}

std::string IsaName(dnnl::cpu_isa isa) {
  switch (static_cast<dnnl_cpu_isa_t>(isa)) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return fmt::format("isa 0x{:x}", static_cast<unsigned>(isa));
  }
}

// True when oneDNN's effective ISA includes AVX512-BF16 (AMX does): ISA values are supersets
// of the bits of the ISAs they extend.
bool HasBf16Instructions(dnnl::cpu_isa isa) {
  const unsigned bits = static_cast<unsigned>(isa), bf16 = dnnl_cpu_isa_avx512_core_bf16;
  return (bits & bf16) == bf16;
}

// Tries a bf16 x bf16 -> fp32 matmul for a linear-layer shape; true if oneDNN offers a
// non-reference implementation. Records the reason for a "no" in s.probe_note.
bool ProbeNativeBf16(State& s) {
  const int64_t n = 256;
  dnnl::memory::desc a({n, n}, dt::bf16, dnnl::memory::dims{n, 1});
  dnnl::memory::desc b({n, n}, dt::bf16, dnnl::memory::dims{1, n});  // Wᵀ, as LinearForward
  dnnl::memory::desc c({n, n}, dt::f32, dnnl::memory::dims{n, 1});
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), s.engine);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) {
      s.probe_note = fmt::format("oneDNN offers only its reference bf16 matmul ({})", impl);
      return false;
    }
    return true;
  } catch (const dnnl::error&) {
    s.probe_note = "oneDNN has no bf16 matmul";
    return false;
  }
}

bool NativeSupportedLocked(State& s) {
  if (!s.native_bf16) {
    s.native_bf16 = ProbeNativeBf16(s);
    s.hardware_bf16 = HasBf16Instructions(dnnl::get_effective_cpu_isa());
    if (*s.native_bf16 && !s.hardware_bf16) {
      s.probe_note = "oneDNN only emulates bf16 matmul (SSHSDP_BF16_GEMM=native uses it)";
    }
  }
  return *s.native_bf16;
}

// The probe's choice: native where the CPU multiplies bf16 itself.
bool AutoIsNative(State& s) { return NativeSupportedLocked(s) && s.hardware_bf16; }

std::string NoNativeMessage(State& s) {
  return fmt::format("{} on this CPU: ISA {}, native bf16 GEMMs need AVX512-BF16 or AMX",
                     s.probe_note, IsaName(dnnl::get_effective_cpu_isa()));
}

Bf16GemmPath ParseLocked(State& s, std::string_view name) {
  if (name == "auto") {
    return AutoIsNative(s) ? Bf16GemmPath::kNative : Bf16GemmPath::kWidened;
  }
  if (name == "widened") return Bf16GemmPath::kWidened;
  SSHSDP_CHECK(name == "native", NumericsError,
               "bf16 GEMM path '{}' is not one of auto, native, widened", name);
  SSHSDP_CHECK(NativeSupportedLocked(s), NumericsError,
               "bf16 GEMM path 'native' requested, but {} (use 'auto' or 'widened': bf16 "
               "operands widened to fp32; or --weight-dtype fp32)",
               NoNativeMessage(s));
  return Bf16GemmPath::kNative;
}

Bf16GemmPath PathLocked(State& s) {
  if (!s.path) {
    s.path =
        ParseEnvChoice("SSHSDP_BF16_GEMM", [&](std::string_view v) { return ParseLocked(s, v); });
  }
  return *s.path;
}

// Widens a bf16 matrix stored with `rows` rows of `cols` elements at row stride ld (or, for a
// dense batch, batch·rows rows) into dense fp32 scratch.
const float* WidenInto(std::vector<float>& buf, const void* src, int64_t rows, int64_t cols,
                       int64_t ld) {
  const size_t count = static_cast<size_t>(rows * cols);
  if (buf.size() < count) buf.resize(count);
  const bf16* in = static_cast<const bf16*>(src);
  if (ld == cols) {
    WidenBf16(in, buf.data(), static_cast<int64_t>(count));
  } else {
    for (int64_t r = 0; r < rows; ++r) WidenBf16(in + r * ld, buf.data() + r * cols, cols);
  }
  return buf.data();
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

// A [outer, inner] grid of logical [rows, cols] matrices at element strides so and si.
dnnl::memory::desc GridDesc(int64_t outer, int64_t inner, int64_t rows, int64_t cols,
                            bool transposed, int64_t ld, int64_t so, int64_t si, dt type) {
  dnnl::memory::dims strides = transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  try {
    return dnnl::memory::desc({outer, inner, rows, cols}, type,
                              dnnl::memory::dims{so, si, strides[0], strides[1]});
  } catch (const dnnl::error& e) {
    throw NumericsError(fmt::format(
        "GemmBatchedStrided: oneDNN refuses a [{}, {}, {}, {}] operand at strides [{}, {}, {}, "
        "{}]: {}",
        outer, inner, rows, cols, so, si, strides[0], strides[1], e.what()));
  }
}

Cached& GetPrimitive(State& s, const Key& key) {
  auto it = s.cache.find(key);
  if (it != s.cache.end()) return *it->second;
  dt ab = ToDnnl(key.ab);
  dt c = ToDnnl(key.c);
  dnnl::memory::desc a_md, b_md, c_md;
  if (key.outer > 0) {
    const auto& g = key.grid_strides;
    a_md = GridDesc(key.outer, key.batch, key.m, key.k, key.trans_a, key.lda, g[0], g[1], ab);
    b_md = GridDesc(key.outer, key.batch, key.k, key.n, key.trans_b, key.ldb, g[2], g[3], ab);
    c_md = GridDesc(key.outer, key.batch, key.m, key.n, false, key.ldc, g[4], g[5], c);
  } else {
    a_md = MatrixDesc(key.batch, key.m, key.k, key.trans_a, key.lda, ab);
    b_md = MatrixDesc(key.batch, key.k, key.n, key.trans_b, key.ldb, ab);
    c_md = MatrixDesc(key.batch, key.m, key.n, false, key.ldc, c);
  }
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
    throw NumericsError(
        fmt::format("oneDNN matmul {}x{}x{} (batch {}) {}->{} unsupported on this CPU (ISA {}): "
                    "{}{}",
                    key.m, key.n, key.k, key.batch, DTypeName(key.ab), DTypeName(key.c),
                    IsaName(dnnl::get_effective_cpu_isa()), e.what(),
                    key.ab == DType::kBF16 ? " (without a native bf16 matmul: "
                                             "SSHSDP_BF16_GEMM=widened, or --weight-dtype fp32)"
                                           : ""));
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
  if (key.k != 0 && key.ab == DType::kBF16 && PathLocked(s) == Bf16GemmPath::kWidened) {
    // Stored shapes: A [m,k] (or [k,m] when trans_a), B [k,n] (or [n,k]); a dense batch is
    // batch times as many rows.
    const int64_t a_rows = key.batch * (key.trans_a ? key.k : key.m);
    const int64_t a_cols = key.trans_a ? key.m : key.k;
    const int64_t b_rows = key.batch * (key.trans_b ? key.n : key.k);
    const int64_t b_cols = key.trans_b ? key.k : key.n;
    a = WidenInto(s.wide_a, a, a_rows, a_cols, key.lda);
    b = WidenInto(s.wide_b, b, b_rows, b_cols, key.ldb);
    key.lda = a_cols;
    key.ldb = b_cols;
    key.ab = DType::kF32;
  }
  if (key.k == 0) {
    if (key.accumulate) return;
    for (int64_t r = 0; r < key.batch * key.m; ++r) {
      std::fill_n(static_cast<char*>(c) + r * key.ldc * esize, key.n * esize, 0);
    }
    return;
  }
  const bool amx =
      key.ab == DType::kBF16 && key.batch == 1 && ActiveBf16GemmKernel() == Bf16GemmKernel::kAmx;
  if (amx && key.c == DType::kF32) {
    amx::GemmBf16(key.trans_a, key.trans_b, key.m, key.n, key.k, static_cast<const bf16*>(a),
                  key.lda, static_cast<const bf16*>(b), key.ldb, static_cast<float*>(c), key.ldc,
                  key.alpha, key.accumulate);
    return;
  }
  if (key.c == DType::kBF16 && (amx || key.ab == DType::kF32)) {
    // oneDNN has no f32 x f32 -> bf16 matmul, the AMX kernel sums in fp32: compute in fp32 and
    // round once.
    const int64_t rows = key.batch * key.m;
    const size_t count = static_cast<size_t>(rows * key.n);
    if (s.scratch_c.size() < count) s.scratch_c.resize(count);
    float* tmp = s.scratch_c.data();
    if (amx) {
      amx::GemmBf16(key.trans_a, key.trans_b, key.m, key.n, key.k, static_cast<const bf16*>(a),
                    key.lda, static_cast<const bf16*>(b), key.ldb, tmp, key.n, key.alpha, false);
    } else {
      Key f32 = key;
      f32.c = DType::kF32;
      f32.accumulate = false;
      f32.ldc = key.n;
      Execute(s, f32, a, b, tmp);
    }
    for (int64_t r = 0; r < rows; ++r) {
      WriteOrAccumulate(tmp + r * key.n, static_cast<bf16*>(c) + r * key.ldc, DType::kBF16, key.n,
                        key.accumulate);
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

// A linear layer's activation as the bf16 product consumes it: an fp32 one rounded into bf16
// scratch (native path) or through bf16 into fp32 scratch (widened path: the caller then runs
// the product with fp32 operands); an already rounded one as it is (native) or widened into
// fp32 scratch (widened). Either way the product sees the same values.
const void* Bf16Activation(State& s, std::vector<bf16>& narrow, std::vector<float>& wide,
                           LinearInput src, int64_t n) {
  const bool native = PathLocked(s) == Bf16GemmPath::kNative;
  if (src.dtype == DType::kBF16) return native ? src.data : WidenInto(wide, src.data, n, 1, 1);
  const float* x = static_cast<const float*>(src.data);
  s.rounded_elements += n;
  if (native) return ToBf16Scratch(narrow, x, n);
  if (wide.size() < static_cast<size_t>(n)) wide.resize(static_cast<size_t>(n));
  RoundThroughBf16(x, wide.data(), n);
  return wide.data();
}

// A rounded activation goes with a bf16 product only.
void CheckInput(LinearInput in, DType compute_dtype, const char* what) {
  SSHSDP_CHECK(in.dtype == DType::kF32 || compute_dtype == DType::kBF16, NumericsError,
               "{}: a bf16 activation needs a bf16 weight, got a {} weight (pass the fp32 "
               "activation)",
               what, DTypeName(compute_dtype));
}

// The operands of a linear layer's product with weight w [n, k] in *ab (fp32 or bf16): for
// bf16, the activation `act` (act_n elements) as the product consumes it, and on the
// widened path the weight widened too, with *ab then fp32. fp32 operands pass unchanged.
void LinearOperands(State& s, LinearInput act, int64_t act_n, int64_t n, int64_t k, const void** a,
                    const void** w, DType* ab, const char* what) {
  CheckInput(act, *ab, what);
  if (*ab != DType::kBF16) return;
  *a = Bf16Activation(s, s.scratch_a, s.wide_a, act, act_n);
  if (PathLocked(s) == Bf16GemmPath::kWidened) {
    *w = WidenInto(s.wide_b, *w, n, k, k);
    *ab = DType::kF32;
  }
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

void GemmBatchedStrided(bool trans_a, bool trans_b, int64_t outer, int64_t inner, int64_t m,
                        int64_t n, int64_t k, const float* a, int64_t lda, GridStrides sa,
                        const float* b, int64_t ldb, GridStrides sb, float* c, int64_t ldc,
                        GridStrides sc, bool accumulate, float alpha) {
  SSHSDP_CHECK(outer >= 0 && inner >= 0 && m >= 0 && n >= 0 && k >= 0, NumericsError,
               "GemmBatchedStrided: invalid shape {}x{} grid, m={} n={} k={}", outer, inner, m, n,
               k);
  SSHSDP_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n, NumericsError,
               "GemmBatchedStrided: leading dimensions lda={} ldb={} ldc={} too small for m={} "
               "n={} k={}",
               lda, ldb, ldc, m, n, k);
  if (outer == 0 || inner == 0 || m == 0 || n == 0) return;  // nothing is written
  SSHSDP_CHECK(sa.outer >= 0 && sa.inner >= 0 && sb.outer >= 0 && sb.inner >= 0 && sc.outer >= 0 &&
                   sc.inner >= 0 && (outer <= 1 || sc.outer > 0) && (inner <= 1 || sc.inner > 0),
               NumericsError,
               "GemmBatchedStrided: grid strides A {}/{} B {}/{} C {}/{} for a {}x{} grid (all "
               ">= 0; C's > 0 along a dimension of more than one product, or the products "
               "overwrite each other)",
               sa.outer, sa.inner, sb.outer, sb.inner, sc.outer, sc.inner, outer, inner);
  if (k == 0) {
    if (accumulate) return;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        for (int64_t r = 0; r < m; ++r)
          std::fill_n(c + o * sc.outer + i * sc.inner + r * ldc, n, 0.0f);
      }
    }
    return;
  }
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  Key key{trans_a, trans_b, inner,       m,           n,          k,    lda,
          ldb,     ldc,     DType::kF32, DType::kF32, accumulate, alpha};
  key.outer = outer;
  key.grid_strides = {sa.outer, sa.inner, sb.outer, sb.inner, sc.outer, sc.inner};
  Execute(s, key, a, b, c);
}

void LinearForward(LinearInput x, const void* w, DType w_dtype, float* y, int64_t m, int64_t n,
                   int64_t k) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  const void* a = x.data;
  DType ab = w_dtype;
  LinearOperands(s, x, m * k, n, k, &a, &w, &ab, "LinearForward");
  GemmLocked(s, DenseKey(false, true, m, n, k, ab, DType::kF32, false, 1), a, w, y);
}

void LinearBackwardData(LinearInput dy, const void* w, DType w_dtype, float* dx, int64_t m,
                        int64_t n, int64_t k, bool accumulate) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  const void* a = dy.data;
  DType ab = w_dtype;
  LinearOperands(s, dy, m * n, n, k, &a, &w, &ab, "LinearBackwardData");
  GemmLocked(s, DenseKey(false, false, m, k, n, ab, DType::kF32, accumulate, 1), a, w, dx);
}

// LinearBackwardWeight pads dy's rows when they are a multiple of this many fp32 (2 KiB).
constexpr int64_t kPadRowsFrom = 512;

void LinearBackwardWeight(LinearInput dy, LinearInput x, DType compute_dtype, void* dw,
                          DType dw_dtype, int64_t m, int64_t n, int64_t k, bool accumulate) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  CheckInput(dy, compute_dtype, "LinearBackwardWeight (dy)");
  CheckInput(x, compute_dtype, "LinearBackwardWeight (x)");
  const void* a = dy.data;
  const void* b = x.data;
  DType ab = compute_dtype;
  const bool widened = compute_dtype == DType::kBF16 && PathLocked(s) == Bf16GemmPath::kWidened;
  // dyᵀ is read down columns of rows 2 / 4 KiB apart, which map to the same cache sets: on
  // AVX2 (Zen 3) oneDNN's fp32 GEMM runs at 30-37 GFLOP/s there against 60-76 with rows
  // 16 floats longer (fc1's weight gradient, n = d_ff = 1024: 29 -> 14 ms at m = 2048). dy
  // goes into rows of n + 16 in the same pass that (widened path) rounds or widens it.
  const bool pad =
      (compute_dtype == DType::kF32 || widened) && n >= kPadRowsFrom && n % kPadRowsFrom == 0;
  if (compute_dtype == DType::kBF16) {
    if (!pad) a = Bf16Activation(s, s.scratch_a, s.wide_a, dy, m * n);
    b = Bf16Activation(s, s.scratch_b, s.wide_b, x, m * k);
    if (widened) ab = DType::kF32;
  } else {
    ToDnnl(compute_dtype);
  }
  if (pad) {
    const int64_t lda = n + 16;
    if (s.pad_a.size() < static_cast<size_t>(m * lda)) s.pad_a.resize(static_cast<size_t>(m * lda));
    for (int64_t r = 0; r < m; ++r) {
      float* row = s.pad_a.data() + r * lda;
      if (dy.dtype == DType::kBF16) {
        WidenBf16(static_cast<const bf16*>(dy.data) + r * n, row, n);
      } else if (widened) {
        RoundThroughBf16(static_cast<const float*>(dy.data) + r * n, row, n);
        s.rounded_elements += n;
      } else {
        std::memcpy(row, static_cast<const float*>(dy.data) + r * n, n * 4);
      }
    }
    GemmLocked(s, Key{true, false, 1, n, k, m, lda, k, k, ab, dw_dtype, accumulate, 1.0f},
               s.pad_a.data(), b, dw);
    return;
  }
  GemmLocked(s, DenseKey(true, false, n, k, m, ab, dw_dtype, accumulate, 1), a, b, dw);
}

int64_t LinearRoundedElements() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.rounded_elements;
}

std::string_view Bf16GemmPathName(Bf16GemmPath path) {
  return path == Bf16GemmPath::kNative ? "native" : "widened";
}

Bf16GemmPath ParseBf16GemmPath(std::string_view name) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  return ParseLocked(s, name);
}

bool NativeBf16GemmSupported() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  return NativeSupportedLocked(s);
}

Bf16GemmPath ActiveBf16GemmPath() {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  return PathLocked(s);
}

void SetBf16GemmPath(Bf16GemmPath path) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.path = ParseLocked(s, Bf16GemmPathName(path));
}

std::string CpuIsaName() { return IsaName(dnnl::get_effective_cpu_isa()); }

std::string GemmPathDescription(DType dtype) {
  const std::string fp32 =
      GemmImplementation(false, true, 1024, 1024, 1024, DType::kF32, DType::kF32);
  if (dtype != DType::kBF16) return fmt::format("{} (oneDNN {})", DTypeName(dtype), fp32);
  if (ActiveBf16GemmPath() == Bf16GemmPath::kNative) {
    const std::string onednn =
        GemmImplementation(false, true, 1024, 1024, 1024, dtype, DType::kF32);
    if (ActiveBf16GemmKernel() == Bf16GemmKernel::kAmx) {
      return fmt::format("bf16 native (AMX tiles, sshsdp's kernel; oneDNN {} for batched products)",
                         onednn);
    }
    return fmt::format("bf16 native (oneDNN {})", onednn);
  }
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string why = AutoIsNative(s)
                              ? std::string("forced by SSHSDP_BF16_GEMM / SetBf16GemmPath")
                              : NoNativeMessage(s);
  return fmt::format("bf16 widened to fp32 ({}), fp32 oneDNN {}", why, fp32);
}

std::string GemmImplementation(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               DType ab_dtype, DType c_dtype) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (c_dtype == DType::kBF16 && ab_dtype == DType::kF32) c_dtype = DType::kF32;
  if (ab_dtype == DType::kBF16 && PathLocked(s) == Bf16GemmPath::kWidened) {
    ab_dtype = DType::kF32;
    if (c_dtype == DType::kBF16) c_dtype = DType::kF32;
  }
  Cached& p = GetPrimitive(s, DenseKey(trans_a, trans_b, m, n, k, ab_dtype, c_dtype, false, 1));
  return p.pd.impl_info_str();
}

}  // namespace sshsdp::kernels
