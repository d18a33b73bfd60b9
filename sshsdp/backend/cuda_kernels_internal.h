// The CUDA backend's kernels behind plain launch functions (cuda_backend.cc calls them): each
// enqueues its kernel on `stream` and returns the launch's cudaError_t. This header and
// cuda_kernels.cu include nothing of sshsdp's (nvcc's front end rejects fmt's consteval format
// strings), so the scalar rules they apply are restated here from numerics/dtype.h (bf16 RNE),
// update/adamw.h (AdamW), update/muon.h (Muon's elementwise stages) and numerics/mx.h + fp8.h (MX
// scale codes, saturating E4M3 / E5M2 encoding) — backend/backend_test.cc holds them equal to
// those, bit for bit, on every input it tries.
//
//   cudaError_t e = LaunchCastF32ToBf16(x, y, n, stream);
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sshsdp::cuda {

// Each assumes n > 0 (callers skip empty ops).
cudaError_t LaunchFill(float* x, int64_t n, float value, cudaStream_t s);
cudaError_t LaunchCastF32ToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s);
cudaError_t LaunchCastBf16ToF32(const uint16_t* x, float* y, int64_t n, cudaStream_t s);

struct AdamWArgs {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2, decay, grad_scale;
};
cudaError_t LaunchAdamW(float* w, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a,
                        cudaStream_t s);
// update/muon.h's MuonMomentum (u: fp32 when u_f32, else bf16 bits) and MuonWeightUpdate
// (decay = 1 − lr·weight_decay, computed by the caller) (cuda_update_kernels.cu).
cudaError_t LaunchMuonMomentum(const float* grad, float* m, void* u, bool u_f32, int64_t n,
                               float momentum, bool nesterov, float grad_scale, cudaStream_t s);
cudaError_t LaunchMuonWeightUpdate(float* w, const float* v, int64_t n, float decay, float lr,
                                   cudaStream_t s);

// Σ x² in double, deterministic: `partial` holds kSumSquaresPartials + 1 doubles; the total
// lands in partial[kSumSquaresPartials].
inline constexpr int kSumSquaresPartials = 1024;
cudaError_t LaunchSumSquares(const float* x, int64_t n, double* partial, cudaStream_t s);

// Newton–Schulz pieces (kernels/newton_schulz.cc's iteration):
// x_b *= 1 / (‖x_b‖_F + 1e-7) for `batch` contiguous matrices of `per` floats.
cudaError_t LaunchNormalizeMatrices(float* x, int64_t per, int64_t batch, cudaStream_t s);
// B = b·A + c·B, then + a on the diagonal of every m×m matrix; `total` = batch·m·m.
cudaError_t LaunchNsPolynomial(const float* A, float* B, int64_t total, int64_t m, float a, float b,
                               float c, cudaStream_t s);
// out[b][i] = scale · x[b·per + i]; out is a device array of `batch` pointers.
cudaError_t LaunchScaleOut(const float* x, float* const* out, int64_t per, int64_t batch,
                           float scale, cudaStream_t s);

// numerics/mx.h's MxQuantizeWeight: row-major [rows, cols] (rows, cols > 0) to codes q and
// scales [ceil(rows/32), ceil(cols/32)]; e4m3 (else E5M2), ceil (else the OCP floor rule).
// Column blocks at most 2^31 - 1, row blocks at most 65535.
cudaError_t LaunchMxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q,
                                   uint8_t* scales, bool e4m3, bool ceil, cudaStream_t s);

// numerics/mx.h's MxDequantizeWeight (block_rows 32: scales [ceil(rows/32), ceil(cols/32)])
// and MxDequantizeActivation (block_rows 1: scales [rows, ceil(cols/32)]): out [rows, cols] =
// decode(q) · 2^(scale - 127).
cudaError_t LaunchMxDequantize(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                               int block_rows, float* out, bool e4m3, cudaStream_t s);
// The same rounded to bf16 bits (round to nearest even) as it is written.
cudaError_t LaunchMxDequantizeBf16(const uint8_t* q, const uint8_t* scales, int64_t rows,
                                   int64_t cols, int block_rows, uint16_t* out, bool e4m3,
                                   cudaStream_t s);

// The reference GPT's layer kernels (kernels/layer_kernels.h), rows > 0 / n > 0. Rows go one
// per block (at most 2^31 - 1). eps and c (= kRmsEps, kGeluC) come from the caller.
cudaError_t LaunchRmsNormForward(const float* x, const float* g, float* y, float* rstd,
                                 int64_t rows, int d, float eps, cudaStream_t s);
cudaError_t LaunchRmsNormBackward(const float* dy, const float* x, const float* g,
                                  const float* rstd, float* dx, float* dg, int64_t rows, int d,
                                  bool accumulate_dx, cudaStream_t s);
cudaError_t LaunchGeluForward(const float* x, float* y, int64_t n, float c, cudaStream_t s);
cudaError_t LaunchGeluBackward(const float* x, float* dy, int64_t n, float c, cudaStream_t s);
cudaError_t LaunchSwigluForward(const float* h1, const float* h3, float* a, int64_t n,
                                cudaStream_t s);
cudaError_t LaunchSwigluBackward(const float* h1, const float* h3, const float* da, float* dh1,
                                 float* dh3, int64_t n, cudaStream_t s);
// row_loss: rows doubles of scratch; *total (device) = Σ losses in double.
cudaError_t LaunchSoftmaxCrossEntropy(float* logits, const int32_t* targets, float* losses,
                                      double* row_loss, int64_t rows, int64_t V, int64_t ld,
                                      double* total, cudaStream_t s);
cudaError_t LaunchSoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets,
                                              float* dlogits, int64_t rows, int64_t ld, float scale,
                                              cudaStream_t s);

// Embeddings over fp32 tables; the backward adds into dwte / dwpe (the caller zeroes them
// first unless accumulating). B·T > 0, d > 0.
cudaError_t LaunchEmbeddingForward(const float* wte, const float* wpe, const int32_t* tokens, int B,
                                   int T, int d, float* out, cudaStream_t s);
cudaError_t LaunchEmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d,
                                    float* dwte, float* dwpe, cudaStream_t s);
cudaError_t LaunchAdd(const float* a, const float* b, float* y, int64_t n, cudaStream_t s);

// The MoE router (kernels/moe_kernels.h; cuda_moe_kernels.cu): N > 0 (MoeExpertStats: N >= 0,
// writing zeros), 1 <= k <= E, k <= 64 for the backward.
cudaError_t LaunchMoeTopK(float* score, int64_t N, int E, int k, bool softmax, bool renormalize,
                          int32_t* sel, float* gate, cudaStream_t s);
cudaError_t LaunchMoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                                 bool softmax, int32_t* count, double* psum, cudaStream_t s);
cudaError_t LaunchMoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k,
                             int32_t* row, int32_t* token, cudaStream_t s);
cudaError_t LaunchMoeRouterBackward(const float* score, const int32_t* sel, const float* gate,
                                    const float* frac, const float* dgate, int64_t N, int E, int k,
                                    bool softmax, bool renormalize, float aux_weight, float* dz,
                                    cudaStream_t s);
// The MoE permutation ops (kernels/moe_kernels.h; cuda_moe_kernels.cu), rows / N > 0, d > 0.
cudaError_t LaunchGatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows,
                             int64_t d, cudaStream_t s);
cudaError_t LaunchMoeCombine(const float* yp, const int32_t* row, const float* gate, float* out,
                             int64_t N, int k, int64_t d, bool accumulate, cudaStream_t s);
cudaError_t LaunchMoeCombineBackward(const float* dy, const float* yp, const int32_t* row,
                                     const float* gate, float* dgate, float* dyp, int64_t N, int k,
                                     int64_t d, cudaStream_t s);
cudaError_t LaunchMoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k,
                                  int64_t d, cudaStream_t s);

// The direct path's reduction (cuda_direct_kernels.cu): out[i] (=|+=) Σ_{j<m} src[j][i] in
// fp32, in the order of j; sources fp32 or bf16, out fp32 or bf16 (RNE). 1 <= m <= kMaxSlices.
constexpr int kMaxSlices = 64;
struct SliceArgs {
  const void* src[kMaxSlices];
};
cudaError_t LaunchReduceSlices(const SliceArgs& a, int m, bool src_bf16, void* out, bool out_bf16,
                               int64_t n, bool accumulate, cudaStream_t s);
// Causal attention (kernels/attention.h's layout; cuda_attention_kernels.cu): B, T, H > 0,
// 0 < dh <= kMaxAttentionHeadDim, B, H <= 65535; D: B·H·T floats of scratch.
constexpr int kMaxAttentionHeadDim = 256;
cudaError_t LaunchAttentionForward(const float* qkv, float* out, float* lse, int B, int T, int H,
                                   int dh, float scale, cudaStream_t s);
cudaError_t LaunchAttentionBackward(const float* dout, const float* qkv, const float* out,
                                    const float* lse, float* dqkv, float* D, int B, int T, int H,
                                    int dh, float scale, cudaStream_t s);

}  // namespace sshsdp::cuda
