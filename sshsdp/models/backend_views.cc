// Backend models' view checks and MXFP8 dequantization (backend_views.h).
#include "sshsdp/models/backend_views.h"

#include "sshsdp/base/error.h"

namespace sshsdp {

void* MxScratch::Reserve(int64_t bytes) {
  if (bytes > bytes_) {
    b_.Free(p_);
    p_ = nullptr;
    bytes_ = 0;
    p_ = b_.Alloc(static_cast<size_t>(bytes));
    bytes_ = bytes;
  }
  return p_;
}

std::vector<const void*> BackendWeights(Backend& b, const char* model, int g,
                                        const std::vector<TensorRef>& v,
                                        const std::vector<RuntimeParamSpec>& specs, bool mx_ok,
                                        DType mx_gemm, MxScratch* scratch, DType* dtype) {
  SSHSDP_CHECK(v.size() == specs.size(), PlanError, "{} group {}: got {} weight views, expected {}",
               model, g, v.size(), specs.size());
  const bool mx = !v.empty() && v[0].dtype == DType::kE4M3;
  SSHSDP_CHECK(!mx || mx_ok, ConfigError,
               "{} group {}: MXFP8 weight views for a group that consumes none (only the MoE "
               "model's expert groups and the dense GPT's blocks are MX)",
               model, g);
  std::vector<const void*> p;
  for (size_t i = 0; i < v.size(); ++i) {
    SSHSDP_CHECK(
        v[i].dtype == v[0].dtype && (v[i].dtype == DType::kF32 || v[i].dtype == DType::kBF16 || mx),
        ConfigError,
        "{} group {}: weight view {} is {} (view 0: {}); a model on a backend runs fp32, bf16 "
        "or MXFP8 (e4m3) runtime weights, one dtype per group (--weight-dtype fp32, bf16 or "
        "mxfp8)",
        model, g, i, DTypeName(v[i].dtype), DTypeName(v[0].dtype));
    SSHSDP_CHECK(v[i].data != nullptr, PlanError, "{} group {}: weight view {} is null", model, g,
                 i);
    SSHSDP_CHECK(!mx || (v[i].scales != nullptr && v[i].scale_layout == ScaleLayout::kRowMajor),
                 ConfigError,
                 "{} group {}: MXFP8 weight view {} needs its scales relaid out row-major "
                 "(--scale-layout row_major), got {}",
                 model, g, i, v[i].scales ? ScaleLayoutName(v[i].scale_layout) : "no scales");
    p.push_back(v[i].data);
  }
  *dtype = v.empty() ? DType::kF32 : v[0].dtype;
  if (!mx) return p;
  SSHSDP_CHECK(mx_gemm == DType::kF32 || mx_gemm == DType::kBF16, ConfigError,
               "{}: the GEMMs of MXFP8 weights run in fp32 or bf16, got {}", model,
               DTypeName(mx_gemm));
  // Every view dequantized whole (codes [rows, cols], per-row scales), 64-byte aligned each.
  const int64_t es = static_cast<int64_t>(DTypeSize(mx_gemm));
  int64_t need = 0;
  for (const RuntimeParamSpec& s : specs) need += (s.numel() + 31) / 32 * 32;
  char* base = static_cast<char*>(scratch->Reserve(need * es));
  int64_t at = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t rows = 0, cols = 0;
    MatrixView(specs[i].shape, &rows, &cols);
    const auto* q = static_cast<const uint8_t*>(v[i].data);
    void* out = base + at * es;
    if (mx_gemm == DType::kBF16) {  // one pass, exact for E4M3 in bf16's normal range
      b.MxDequantizeRowsBf16(q, v[i].scales, rows, cols, static_cast<bf16*>(out),
                             MxOptions{DType::kE4M3});
    } else {
      b.MxDequantizeRows(q, v[i].scales, rows, cols, static_cast<float*>(out),
                         MxOptions{DType::kE4M3});
    }
    p[i] = out;
    at += (specs[i].numel() + 31) / 32 * 32;
  }
  *dtype = mx_gemm;
  return p;
}

std::vector<float*> BackendGrads(const char* model, int g, const std::vector<TensorRef>& v,
                                 size_t want) {
  SSHSDP_CHECK(v.size() == want, PlanError, "{} group {}: got {} gradient views, expected {}",
               model, g, v.size(), want);
  std::vector<float*> p;
  for (size_t i = 0; i < v.size(); ++i) {
    SSHSDP_CHECK(v[i].dtype == DType::kF32, ConfigError,
                 "{} group {}: gradient view {} is {}; a model on a backend writes fp32 "
                 "gradients (--reduce fp32)",
                 model, g, i, DTypeName(v[i].dtype));
    SSHSDP_CHECK(v[i].data != nullptr, PlanError, "{} group {}: gradient view {} is null", model, g,
                 i);
    p.push_back(static_cast<float*>(v[i].data));
  }
  return p;
}

}  // namespace sshsdp
