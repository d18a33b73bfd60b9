// The views the backend MoE model (BackendMoeModel) hands its kernels on a device
// backend: a runtime group's weight views checked and turned into pointers in their one dtype —
// MXFP8 views dequantized into scratch on the backend first (Backend::MxDequantizeRows, or
// MxDequantizeRowsBf16 for bf16 GEMMs: what a GPU without an MX GEMM, Hopper, does) — and its
// gradient views as fp32 pointers. PlanError / ConfigError name the model, the group, the view
// and the option that fixes it.
//
//   MxScratch scratch(backend);
//   DType wdt = DType::kF32;
//   std::vector<const void*> w = BackendWeights(backend, "BackendMoeModel", g, views,
//                                               model.GroupParams(g), /*mx_ok=*/true,
//                                               DType::kF32, &scratch, &wdt);
//   std::vector<float*> d = BackendGrads("BackendMoeModel", g, grad_views, w.size());
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

// One group's dequantized MXFP8 weights, in backend memory, grown when a group needs more.
class MxScratch {
 public:
  explicit MxScratch(Backend& b) : b_(b) {}
  ~MxScratch() { b_.Free(p_); }
  MxScratch(const MxScratch&) = delete;
  MxScratch& operator=(const MxScratch&) = delete;
  // At least `bytes` bytes (the old contents are not kept).
  void* Reserve(int64_t bytes);
  int64_t bytes() const { return bytes_; }

 private:
  Backend& b_;
  void* p_ = nullptr;
  int64_t bytes_ = 0;
};

// Group g's weight views (one per spec) as pointers in their one dtype, fp32 or bf16 (*dtype).
// MXFP8 (e4m3) views — refused unless mx_ok (the group consumes MX) — need row-major scales
// (ScaleLayout::kRowMajor); each is dequantized whole, [rows, cols] of its MatrixView, into
// `scratch` in mx_gemm (fp32 or bf16), which *dtype then is.
std::vector<const void*> BackendWeights(Backend& b, const char* model, int g,
                                        const std::vector<TensorRef>& v,
                                        const std::vector<RuntimeParamSpec>& specs, bool mx_ok,
                                        DType mx_gemm, MxScratch* scratch, DType* dtype);
// Group g's gradient views as fp32 pointers (`want` of them; --reduce fp32).
std::vector<float*> BackendGrads(const char* model, int g, const std::vector<TensorRef>& v,
                                 size_t want);

}  // namespace sshsdp
