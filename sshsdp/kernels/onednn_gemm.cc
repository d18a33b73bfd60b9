// oneDNN's matmul primitive behind matmul.h: a cache of primitives by product (shape,
// transposes, strides, dtypes, mode), one engine and stream for the process.
//
// Transposed operands are expressed as strided memory descriptors, so no operand is ever
// transposed in memory. Accumulation is oneDNN's sum post-op, which reads the destination;
// without it the primitive writes the destination without reading it, so NaN-filled outputs
// are replaced.
#include <dnnl.hpp>

#include <map>
#include <memory>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/gemm_internal.h"

namespace sshsdp::kernels {
namespace internal {
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

}  // namespace

// A primitive and its descriptor, cached per product.
struct OneDnnPrimitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

struct OneDnnCache {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<GemmKey, std::unique_ptr<OneDnnPrimitive>> primitives;
};

namespace {

OneDnnCache& Cache(GemmState& s) {
  if (!s.onednn) s.onednn = new OneDnnCache();
  return *s.onednn;
}

dnnl::matmul::primitive_desc MakeDesc(OneDnnCache& cache, const GemmKey& key) {
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
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, cache.engine);
}

OneDnnPrimitive& GetPrimitive(GemmState& s, const GemmKey& key) {
  OneDnnCache& cache = Cache(s);
  auto it = cache.primitives.find(key);
  if (it != cache.primitives.end()) return *it->second;
  try {
    dnnl::matmul::primitive_desc pd = MakeDesc(cache, key);
    auto cached = std::make_unique<OneDnnPrimitive>(OneDnnPrimitive{pd, dnnl::matmul(pd)});
    return *cache.primitives.emplace(key, std::move(cached)).first->second;
  } catch (const dnnl::error& e) {
    throw NumericsError(fmt::format(
        "oneDNN matmul {}x{}x{} (batch {}) {}->{} unsupported on this CPU (ISA {}): "
        "{}{}",
        key.m, key.n, key.k, key.batch, DTypeName(key.ab), DTypeName(key.c), CpuIsaName(), e.what(),
        key.ab == DType::kBF16 ? " (without a native bf16 matmul: "
                                 "SSHSDP_BF16_GEMM=widened, or --weight-dtype fp32)"
                               : ""));
  }
}

}  // namespace

void OneDnnExecuteLocked(GemmState& s, const GemmKey& key, const void* a, const void* b, void* c) {
  OneDnnPrimitive& p = GetPrimitive(s, key);
  OneDnnCache& cache = Cache(s);
  dnnl::memory am(p.pd.src_desc(), cache.engine, const_cast<void*>(a));
  dnnl::memory bm(p.pd.weights_desc(), cache.engine, const_cast<void*>(b));
  dnnl::memory cm(p.pd.dst_desc(), cache.engine, c);
  p.prim.execute(cache.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  cache.stream.wait();
}

std::string OneDnnImplementationLocked(GemmState& s, const GemmKey& key) {
  return GetPrimitive(s, key).pd.impl_info_str();
}

// Tries a bf16 x bf16 -> fp32 matmul for a linear-layer shape.
bool OneDnnProbeBf16(GemmState& s, std::string* note) {
  const int64_t n = 256;
  dnnl::memory::desc a({n, n}, dt::bf16, dnnl::memory::dims{n, 1});
  dnnl::memory::desc b({n, n}, dt::bf16, dnnl::memory::dims{1, n});  // Wᵀ, as LinearForward
  dnnl::memory::desc c({n, n}, dt::f32, dnnl::memory::dims{n, 1});
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), Cache(s).engine);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) {
      *note = fmt::format("oneDNN offers only its reference bf16 matmul ({})", impl);
      return false;
    }
    return true;
  } catch (const dnnl::error&) {
    *note = "oneDNN has no bf16 matmul";
    return false;
  }
}

// ISA values are supersets of the bits of the ISAs they extend.
bool OneDnnHasBf16Instructions() {
  const unsigned bits = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const unsigned bf16 = dnnl_cpu_isa_avx512_core_bf16;
  return (bits & bf16) == bf16;
}

std::string OneDnnVersion() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
}

}  // namespace internal

std::string CpuIsaName() { return internal::IsaName(dnnl::get_effective_cpu_isa()); }

}  // namespace sshsdp::kernels
