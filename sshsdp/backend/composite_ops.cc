// The defaults of Backend's typed layer ops (backend.h), composed of the backend's own
// primitive ops in its scratch: what a backend without fused kernels for them runs (CUDA, the
// guarded test backend). The CPU backend overrides every one with the kernels themselves.
#include "sshsdp/backend/backend.h"

namespace sshsdp {
namespace {

[[noreturn]] void Lacks(const Backend& b, const char* op, const std::string& what) {
  throw DeviceError(
      fmt::format("{}: {} has no {} (the CPU backend has: --backend cpu)", b.name(), op, what));
}

bool IsMx(DType t) { return kernels::IsMxElement(t); }

}  // namespace

const char* BackendFeatureName(BackendFeature f) {
  switch (f) {
    case BackendFeature::kStridedGemm:
      return "strided GEMM (per-part QKV runtime parameters)";
    case BackendFeature::kBf16Attention:
      return "bf16 attention";
    case BackendFeature::kBf16Gradients:
      return "bf16 gradients (--reduce bf16+fp32 / bf16sr)";
    case BackendFeature::kAnyScaleLayout:
      return "MXFP8 scale layouts other than row_major";
    case BackendFeature::kRope:
      return "RoPE / QK-norm / grouped-query attention (the Llama family)";
  }
  return "?";
}

void* Backend::Scratch(int slot, size_t bytes) {
  ScratchBlock& s = scratch_[slot];
  if (s.bytes < bytes) {
    Free(s.p);
    s = {};
    s.p = Alloc(bytes);
    s.bytes = bytes;
  }
  return s.p;
}

void Backend::ReleaseScratch() {
  for (ScratchBlock& s : scratch_) {
    Free(s.p);
    s = {};
  }
}

namespace {

// x as bf16: itself when rounded already, else rounded into scratch `slot` of b.
const bf16* AsBf16(Backend& b, kernels::LinearInput x, int64_t n, bf16* scratch) {
  if (x.dtype == DType::kBF16) return static_cast<const bf16*>(x.data);
  b.CastF32ToBf16(static_cast<const float*>(x.data), scratch, n);
  return scratch;
}

const float* AsF32(const Backend& b, kernels::LinearInput x, const char* op) {
  SSHSDP_CHECK(x.dtype == DType::kF32, NumericsError,
               "{} on {}: a bf16 activation needs a bf16 weight (got an fp32 or MXFP8 one)", op,
               b.name());
  return static_cast<const float*>(x.data);
}

}  // namespace

void Backend::LinearForward(kernels::LinearInput x, const kernels::WeightView& w, float* y,
                            int64_t m, int64_t n, int64_t k) {
  if (w.dtype == DType::kF32) {
    Gemm(false, true, m, n, k, AsF32(*this, x, "LinearForward"), static_cast<const float*>(w.data),
         y, false);
  } else if (w.dtype == DType::kBF16) {
    const bf16* x16 = AsBf16(*this, x, m * k, static_cast<bf16*>(Scratch(0, m * k * 2)));
    GemmBf16(false, true, m, n, k, x16, static_cast<const bf16*>(w.data), y, false);
  } else {
    auto* wf = static_cast<float*>(Scratch(1, n * k * 4));
    MxDequantizeOperand(static_cast<const uint8_t*>(w.data), w.dtype, w.scales, w.layout, n, k, wf);
    Gemm(false, true, m, n, k, AsF32(*this, x, "LinearForward"), wf, y, false);
  }
}

void Backend::LinearBackwardData(kernels::LinearInput dy, const kernels::WeightView& w, float* dx,
                                 int64_t m, int64_t n, int64_t k, bool accumulate) {
  if (w.dtype == DType::kF32) {
    Gemm(false, false, m, k, n, AsF32(*this, dy, "LinearBackwardData"),
         static_cast<const float*>(w.data), dx, accumulate);
  } else if (w.dtype == DType::kBF16) {
    const bf16* dy16 = AsBf16(*this, dy, m * n, static_cast<bf16*>(Scratch(0, m * n * 2)));
    GemmBf16(false, false, m, k, n, dy16, static_cast<const bf16*>(w.data), dx, accumulate);
  } else {
    auto* wf = static_cast<float*>(Scratch(1, n * k * 4));
    MxDequantizeOperand(static_cast<const uint8_t*>(w.data), w.dtype, w.scales, w.layout, n, k, wf);
    Gemm(false, false, m, k, n, AsF32(*this, dy, "LinearBackwardData"), wf, dx, accumulate);
  }
}

void Backend::LinearBackwardWeight(kernels::LinearInput dy, kernels::LinearInput x,
                                   DType compute_dtype, void* dw, DType dw_dtype, int64_t m,
                                   int64_t n, int64_t k, bool accumulate) {
  if (dw_dtype != DType::kF32) Lacks(*this, "LinearBackwardWeight", "bf16 gradients");
  auto* out = static_cast<float*>(dw);
  if (compute_dtype == DType::kBF16) {
    const bf16* dy16 = AsBf16(*this, dy, m * n, static_cast<bf16*>(Scratch(0, m * n * 2)));
    const bf16* x16 = AsBf16(*this, x, m * k, static_cast<bf16*>(Scratch(1, m * k * 2)));
    GemmBf16(true, false, n, k, m, dy16, x16, out, accumulate);
  } else {
    Gemm(true, false, n, k, m, AsF32(*this, dy, "LinearBackwardWeight"),
         AsF32(*this, x, "LinearBackwardWeight"), out, accumulate);
  }
}

void Backend::GemmStrided(bool, bool, int64_t, int64_t, int64_t, const void*, int64_t, const void*,
                          int64_t, DType, void*, int64_t, DType, bool) {
  Lacks(*this, "GemmStrided", BackendFeatureName(BackendFeature::kStridedGemm));
}

void Backend::RmsNormForwardBf16(const float* x, const float* g, bf16* y, float* rstd, int64_t rows,
                                 int d, float eps) {
  auto* t = static_cast<float*>(Scratch(2, rows * d * 4));
  RmsNormForward(x, g, t, rstd, rows, d, eps);
  CastF32ToBf16(t, y, rows * d);
}

void Backend::GeluForwardBf16(const float* x, bf16* y, int64_t n) {
  auto* t = static_cast<float*>(Scratch(2, n * 4));
  GeluForward(x, t, n);
  CastF32ToBf16(t, y, n);
}

void Backend::GeluBackwardBf16(const float* x, const float* dy, bf16* dx, int64_t n) {
  auto* t = static_cast<float*>(Scratch(2, n * 4));
  Copy(t, dy, n * 4);
  GeluBackwardInPlace(x, t, n);
  CastF32ToBf16(t, dx, n);
}

void Backend::SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets,
                                              bf16* dlogits, int64_t rows, int64_t ld,
                                              float scale) {
  auto* t = static_cast<float*>(Scratch(2, rows * ld * 4));
  SoftmaxCrossEntropyBackward(probs, targets, t, rows, ld, scale);
  CastF32ToBf16(t, dlogits, rows * ld);
}

int64_t Backend::AttentionBf16ScratchFloats(int, int, int, int) const { return 0; }

void Backend::CausalAttentionForwardBf16(const float*, float*, float*, float*, int64_t, int, int,
                                         int, int) {
  Lacks(*this, "CausalAttentionForwardBf16", BackendFeatureName(BackendFeature::kBf16Attention));
}

void Backend::CausalAttentionBackwardBf16(const float*, const float*, const float*, const float*,
                                          float*, float*, int64_t, int, int, int, int) {
  Lacks(*this, "CausalAttentionBackwardBf16", BackendFeatureName(BackendFeature::kBf16Attention));
}

void Backend::RopeQkvForward(const float*, const float*, const float*, const float*, const float*,
                             float, float*, float*, const kernels::RopeShape&) {
  Lacks(*this, "RopeQkvForward", BackendFeatureName(BackendFeature::kRope));
}

void Backend::RopeQkvBackward(const float*, const float*, const float*, const float*, const float*,
                              const float*, const float*, float*, float*, float*,
                              const kernels::RopeShape&) {
  Lacks(*this, "RopeQkvBackward", BackendFeatureName(BackendFeature::kRope));
}

void Backend::EmbeddingForwardTyped(const void* wte, const void* wpe, DType dt,
                                    const int32_t* tokens, int B, int T, int d, int64_t vocab,
                                    int64_t seq_len, float* out) {
  if (dt == DType::kF32) {
    EmbeddingForward(static_cast<const float*>(wte), static_cast<const float*>(wpe), tokens, B, T,
                     d, out);
    return;
  }
  SSHSDP_CHECK(dt == DType::kBF16, NumericsError,
               "EmbeddingForwardTyped: tables must be fp32 or bf16, got {}", DTypeName(dt));
  auto* te = static_cast<float*>(Scratch(1, vocab * d * 4));
  auto* pe = wpe ? static_cast<float*>(Scratch(2, seq_len * d * 4)) : nullptr;
  CastBf16ToF32(static_cast<const bf16*>(wte), te, vocab * d);
  if (wpe) CastBf16ToF32(static_cast<const bf16*>(wpe), pe, seq_len * d);
  EmbeddingForward(te, pe, tokens, B, T, d, out);
}

void Backend::EmbeddingBackwardTyped(const float* dx, const int32_t* tokens, int B, int T, int d,
                                     void* dwte, DType dwte_dtype, int64_t vocab, void* dwpe,
                                     DType dwpe_dtype, int64_t seq_len, bool accumulate, float*) {
  if (dwte_dtype != DType::kF32 || dwpe_dtype != DType::kF32)
    Lacks(*this, "EmbeddingBackwardTyped", "bf16 gradients");
  EmbeddingBackward(dx, tokens, B, T, d, static_cast<float*>(dwte), vocab,
                    static_cast<float*>(dwpe), seq_len, accumulate);
}

void Backend::WriteOrAccumulate(const float* src, void* dst, DType dst_dtype, int64_t n,
                                bool accumulate) {
  if (dst_dtype != DType::kF32) Lacks(*this, "WriteOrAccumulate", "bf16 gradients");
  auto* d = static_cast<float*>(dst);
  if (accumulate) {
    Add(d, src, d, n);
  } else {
    Copy(d, src, static_cast<size_t>(n) * 4);
  }
}

void Backend::MxDequantizeOperand(const uint8_t* codes, DType elem, const uint8_t* scales,
                                  ScaleLayout layout, int64_t mn, int64_t k, float* out) {
  SSHSDP_CHECK(IsMx(elem), NumericsError, "MxDequantizeOperand: {} is not an FP8 element type",
               DTypeName(elem));
  if (layout != ScaleLayout::kRowMajor)
    Lacks(*this, "MxDequantizeOperand",
          fmt::format("{} scales (row_major only)", ScaleLayoutName(layout)));
  MxOptions opt;
  opt.elem = elem;
  MxDequantizeRows(codes, scales, mn, k, out, opt);
}

}  // namespace sshsdp
