// The CUDA backend (backend.h): device memory from cudaMalloc, one non-blocking stream per
// backend, the engine's elementwise ops as the kernels of cuda_kernels.cu (the same fp32
// operations as the CPU's, in the same order, no FMA), the sum of squares as a deterministic
// two-pass reduction in double, and Newton–Schulz on cuBLAS strided-batched fp32 GEMMs in
// pedantic math mode (no TF32). Compiled by the host compiler; only the kernels need nvcc.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/backend/cuda_kernels_internal.h"
#include "sshsdp/kernels/layer_kernels.h"

namespace sshsdp {
namespace {

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(
        fmt::format("CUDA error {} ({}) in {}", cudaGetErrorName(e), cudaGetErrorString(e), what));
}
void CheckCublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(fmt::format("cuBLAS error {} in {}", cublasGetStatusString(s), what));
}
#define SSHSDP_CUDA_OK(call) CheckCuda((call), #call)
#define SSHSDP_CUBLAS_OK(call) CheckCublas((call), #call)

// A backend handle's spare cudaEvents (no timing). A hand-off takes one and gives it back when
// its BackendEvent is destroyed — on whichever thread that happens, hence the lock — so a step
// creates events only until the pool covers the most hand-offs in flight at once, instead of a
// create and a destroy per hand-off.
class EventPool {
 public:
  explicit EventPool(int ordinal) : ordinal_(ordinal) {}
  ~EventPool() {
    cudaSetDevice(ordinal_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    SSHSDP_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void Give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  int ordinal_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// One pooled cudaEvent recorded on a stream; any host thread may wait for it. Waiting makes the
// event's device current first: on a thread without one (the engine's communication thread
// before its first collective) the runtime would otherwise open device 0's context. The event
// goes back to the pool when this is destroyed (nobody waits for it after that; the next record
// overwrites it).
class CudaEvent final : public BackendEvent {
 public:
  CudaEvent(EventPool& pool, int ordinal, cudaStream_t stream)
      : pool_(pool), ordinal_(ordinal), event_(pool.Take()) {
    const cudaError_t e = cudaEventRecord(event_, stream);
    if (e != cudaSuccess) pool_.Give(event_);
    CheckCuda(e, "cudaEventRecord");
  }
  ~CudaEvent() override { pool_.Give(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void Wait() override {
    SSHSDP_CUDA_OK(cudaSetDevice(ordinal_));
    SSHSDP_CUDA_OK(cudaEventSynchronize(event_));
  }

 private:
  EventPool& pool_;
  int ordinal_;
  cudaEvent_t event_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int ordinal) : ordinal_(ordinal), events_(ordinal) {
    SSHSDP_CUDA_OK(cudaSetDevice(ordinal));
    cudaDeviceProp p{};
    SSHSDP_CUDA_OK(cudaGetDeviceProperties(&p, ordinal));
    name_ = fmt::format("cuda:{} ({}, sm_{}{})", ordinal, p.name, p.major, p.minor);
    SSHSDP_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SSHSDP_CUBLAS_OK(cublasCreate(&blas_));
    SSHSDP_CUBLAS_OK(cublasSetStream(blas_, stream_));
    SSHSDP_CUBLAS_OK(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH));
    SSHSDP_CUDA_OK(cudaMalloc(&partial_, (cuda::kSumSquaresPartials + 1) * sizeof(double)));
  }
  ~CudaBackend() override {
    ReleaseScratch();  // the typed layer ops run as backend.h's defaults here
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaFree(work_);
    cudaFree(partial_);
    cudaFree(row_loss_);
    cudaFree(attn_d_);
    for (UploadSlot& slot : upload_) {
      if (slot.done) cudaEventDestroy(slot.done);
      if (slot.host) cudaFreeHost(slot.host);
    }
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  int max_attention_head_dim() const override { return cuda::kMaxAttentionHeadDim; }

  void* Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    Use();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw DeviceError(
          fmt::format("{}: cannot allocate {} bytes: {}", name_, bytes, cudaGetErrorString(e)));
    }
    return p;
  }
  void Free(void* p) override {
    if (!p) return;
    cudaSetDevice(ordinal_);
    const cudaError_t e = cudaFree(p);  // waits for the device's work on it
    if (e != cudaSuccess) {
      std::fprintf(stderr, "%s: cudaFree failed: %s\n", name_.c_str(), cudaGetErrorString(e));
      cudaGetLastError();
    }
  }
  void CopyIn(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Use();
    SSHSDP_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    SSHSDP_CUDA_OK(cudaStreamSynchronize(stream_));  // the host source may be reused at once
  }
  // Through a ring of page-locked staging slots: src is copied into the next slot and the
  // stream copies the slot to dst, so the host does not wait for the stream. A slot is reused
  // once the copy queued kUploadSlots uploads ago has run (its event): how far ahead of the
  // device the host may queue microbatches.
  void Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Use();
    UploadSlot& slot = upload_[upload_next_++ % kUploadSlots];
    if (slot.done) SSHSDP_CUDA_OK(cudaEventSynchronize(slot.done));
    if (slot.bytes < bytes) {
      FreeHost(slot.host);
      slot.host = nullptr;
      slot.bytes = 0;
      slot.host = AllocHost(bytes);
      slot.bytes = bytes;
    }
    if (!slot.done) SSHSDP_CUDA_OK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    std::memcpy(slot.host, src, bytes);
    SSHSDP_CUDA_OK(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
    SSHSDP_CUDA_OK(cudaEventRecord(slot.done, stream_));
  }
  void CopyOut(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Use();
    SSHSDP_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    SSHSDP_CUDA_OK(cudaStreamSynchronize(stream_));
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Use();
    SSHSDP_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void Synchronize() override {
    Use();
    SSHSDP_CUDA_OK(cudaStreamSynchronize(stream_));
  }
  std::shared_ptr<BackendEvent> RecordEvent() override {
    Use();
    return std::make_shared<CudaEvent>(events_, ordinal_, stream_);
  }
  std::unique_ptr<Backend> NewStream() override { return std::make_unique<CudaBackend>(ordinal_); }
  void* AllocHost(size_t bytes) override {
    if (bytes == 0) return nullptr;
    Use();
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw DeviceError(fmt::format("{}: cannot allocate {} bytes of page-locked host memory: {}",
                                    name_, bytes, cudaGetErrorString(e)));
    }
    return p;
  }
  void FreeHost(void* p) override {
    if (!p) return;
    cudaSetDevice(ordinal_);
    const cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "%s: cudaFreeHost failed: %s\n", name_.c_str(), cudaGetErrorString(e));
      cudaGetLastError();
    }
  }

  void Fill(float* x, int64_t n, float value) override {
    CheckCount(n, "Fill");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchFill(x, n, value, stream_));
  }
  void Zero(void* x, size_t bytes) override {
    if (bytes == 0) return;
    Use();
    SSHSDP_CUDA_OK(cudaMemsetAsync(x, 0, bytes, stream_));
  }
  void CastF32ToBf16(const float* x, bf16* y, int64_t n) override {
    CheckCount(n, "CastF32ToBf16");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchCastF32ToBf16(x, reinterpret_cast<uint16_t*>(y), n, stream_));
  }
  void CastBf16ToF32(const bf16* x, float* y, int64_t n) override {
    CheckCount(n, "CastBf16ToF32");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchCastBf16ToF32(reinterpret_cast<const uint16_t*>(x), y, n, stream_));
  }
  void AdamW(const AdamWSpan* spans, int count, const AdamWConfig& cfg, int64_t step,
             float grad_scale) override {
    const AdamWScalars k = AdamWStepScalars(cfg, step);
    for (int i = 0; i < count; ++i) CheckCount(spans[i].n, "AdamW");
    Use();
    for (int i = 0; i < count; ++i) {
      const AdamWSpan& s = spans[i];
      if (s.n == 0) continue;
      const cuda::AdamWArgs a{k.beta1,     k.beta2,        k.eps,
                              k.step_size, k.inv_sqrt_bc2, 1.0f - cfg.lr * s.weight_decay,
                              grad_scale};
      SSHSDP_CUDA_OK(cuda::LaunchAdamW(s.w, s.g, s.m, s.v, s.n, a, stream_));
    }
  }
  void MxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scales,
                        const MxOptions& opt) override {
    CheckMxCall(opt, rows, cols, "MxQuantizeWeight");
    SSHSDP_CHECK(MxBlocks(cols) <= kIntMax, NumericsError,
                 "{}: MxQuantizeWeight takes at most (2^31 - 1)·32 columns, got {}", name_, cols);
    SSHSDP_CHECK(MxBlocks(rows) <= 65535, NumericsError,
                 "{}: MxQuantizeWeight takes at most 65535·32 rows, got {}", name_, rows);
    if (rows == 0 || cols == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMxQuantizeWeight(w, rows, cols, q, scales, opt.elem == DType::kE4M3,
                                                opt.rule == MxScaleRule::kCeil, stream_));
  }
  void MxDequantizeRows(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                        float* out, const MxOptions& opt) override {
    Dequantize("MxDequantizeRows", q, scales, rows, cols, 1, out, opt);
  }
  void MxDequantizeRowsBf16(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                            bf16* out, const MxOptions& opt) override {
    CheckMxCall(opt, rows, cols, "MxDequantizeRowsBf16");
    if (rows == 0 || cols == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMxDequantizeBf16(q, scales, rows, cols, 1,
                                                reinterpret_cast<uint16_t*>(out),
                                                opt.elem == DType::kE4M3, stream_));
  }
  void Dequantize(const char* op, const uint8_t* q, const uint8_t* scales, int64_t rows,
                  int64_t cols, int block_rows, float* out, const MxOptions& opt) {
    CheckMxCall(opt, rows, cols, op);
    if (rows == 0 || cols == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMxDequantize(q, scales, rows, cols, block_rows, out,
                                            opt.elem == DType::kE4M3, stream_));
  }
  double SumSquares(const float* x, int64_t n) override {
    CheckCount(n, "SumSquares");
    if (n == 0) return 0.0;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchSumSquares(x, n, partial_, stream_));
    double out = 0.0;
    CopyOut(&out, partial_ + cuda::kSumSquaresPartials, sizeof(double));
    return out;
  }
  void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d,
                      float eps) override {
    CheckRowsFit(rows, d, "RmsNormForward");
    if (rows == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchRmsNormForward(x, g, y, rstd, rows, d, eps, stream_));
  }
  void RmsNormBackward(const float* dy, const float* x, const float* g, const float* rstd,
                       float* dx, float* dg, int64_t rows, int d, bool accumulate_dx) override {
    CheckRowsFit(rows, d, "RmsNormBackward");
    Use();
    if (rows == 0) {  // dg is overwritten with the empty sum
      Fill(dg, d, 0.0f);
      return;
    }
    SSHSDP_CUDA_OK(
        cuda::LaunchRmsNormBackward(dy, x, g, rstd, dx, dg, rows, d, accumulate_dx, stream_));
  }
  void GeluForward(const float* x, float* y, int64_t n) override {
    CheckCount(n, "GeluForward");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchGeluForward(x, y, n, kernels::kGeluC, stream_));
  }
  void GeluBackwardInPlace(const float* x, float* dy, int64_t n) override {
    CheckCount(n, "GeluBackwardInPlace");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchGeluBackward(x, dy, n, kernels::kGeluC, stream_));
  }
  void SwigluForward(const float* h1, const float* h3, float* a, int64_t n) override {
    CheckCount(n, "SwigluForward");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchSwigluForward(h1, h3, a, n, stream_));
  }
  void SwigluBackward(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                      int64_t n) override {
    CheckCount(n, "SwigluBackward");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchSwigluBackward(h1, h3, da, dh1, dh3, n, stream_));
  }
  void SoftmaxCrossEntropyForward(float* logits, const int32_t* targets, float* losses,
                                  int64_t rows, int64_t V, int64_t ld, double* total) override {
    CheckRowsFit(rows, 1, "SoftmaxCrossEntropyForward");
    SSHSDP_CHECK(V >= 1 && V <= ld, NumericsError,
                 "SoftmaxCrossEntropyForward: need 1 <= V <= ld, got V={} ld={}", V, ld);
    SSHSDP_CHECK(total != nullptr, NumericsError,
                 "SoftmaxCrossEntropyForward: no total (a double of the backend's memory)");
    Use();
    if (rows == 0) {
      SSHSDP_CUDA_OK(cudaMemsetAsync(total, 0, sizeof(double), stream_));  // the empty sum
      return;
    }
    if (row_loss_rows_ < rows) {
      Synchronize();
      SSHSDP_CUDA_OK(cudaFree(row_loss_));
      row_loss_ = nullptr;
      row_loss_rows_ = 0;
      SSHSDP_CUDA_OK(cudaMalloc(&row_loss_, static_cast<size_t>(rows) * sizeof(double)));
      row_loss_rows_ = rows;
    }
    SSHSDP_CUDA_OK(cuda::LaunchSoftmaxCrossEntropy(logits, targets, losses, row_loss_, rows, V, ld,
                                                   total, stream_));
  }
  void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits,
                                   int64_t rows, int64_t ld, float scale) override {
    CheckRowsFit(rows, 1, "SoftmaxCrossEntropyBackward");
    if (rows == 0 || ld == 0) return;
    Use();
    SSHSDP_CUDA_OK(
        cuda::LaunchSoftmaxCrossEntropyBackward(probs, targets, dlogits, rows, ld, scale, stream_));
  }
  void EmbeddingForward(const float* wte, const float* wpe, const int32_t* tokens, int B, int T,
                        int d, float* out) override {
    CheckShape(B, T, d, "EmbeddingForward");
    if (B == 0 || T == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchEmbeddingForward(wte, wpe, tokens, B, T, d, out, stream_));
  }
  void EmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d, float* dwte,
                         int64_t vocab, float* dwpe, int64_t seq_len, bool accumulate) override {
    CheckShape(B, T, d, "EmbeddingBackward");
    if (!accumulate) {
      Fill(dwte, vocab * d, 0.0f);
      if (dwpe) Fill(dwpe, seq_len * d, 0.0f);
    }
    if (B == 0 || T == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchEmbeddingBackward(dx, tokens, B, T, d, dwte, dwpe, stream_));
  }
  void CausalAttentionForward(const float* qkv, float* out, float* lse, int B, int T, int H,
                              int dh) override {
    CheckAttention(B, T, H, dh, "CausalAttentionForward");
    if (B == 0 || T == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchAttentionForward(qkv, out, lse, B, T, H, dh, Scale(dh), stream_));
  }
  void CausalAttentionBackward(const float* dout, const float* qkv, const float* out,
                               const float* lse, float* dqkv, int B, int T, int H,
                               int dh) override {
    CheckAttention(B, T, H, dh, "CausalAttentionBackward");
    if (B == 0 || T == 0) return;
    Use();
    const int64_t rows = int64_t{B} * H * T;
    if (attn_d_rows_ < rows) {
      Synchronize();
      SSHSDP_CUDA_OK(cudaFree(attn_d_));
      attn_d_ = nullptr;
      attn_d_rows_ = 0;
      SSHSDP_CUDA_OK(cudaMalloc(&attn_d_, static_cast<size_t>(rows) * sizeof(float)));
      attn_d_rows_ = rows;
    }
    SSHSDP_CUDA_OK(cuda::LaunchAttentionBackward(dout, qkv, out, lse, dqkv, attn_d_, B, T, H, dh,
                                                 Scale(dh), stream_));
  }
  void Add(const float* a, const float* b, float* y, int64_t n) override {
    CheckCount(n, "Add");
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchAdd(a, b, y, n, stream_));
  }
  void MoeTopK(float* score, int64_t N, int E, int k, const kernels::MoeRouterOptions& opt,
               int32_t* sel, float* gate) override {
    CheckRouterShape(N, E, k, "MoeTopK");
    if (N == 0) return;
    Use();
    SSHSDP_CUDA_OK(
        cuda::LaunchMoeTopK(score, N, E, k, opt.softmax, opt.renormalize, sel, gate, stream_));
  }
  void MoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                      const kernels::MoeRouterOptions& opt, int32_t* count, double* psum) override {
    CheckRouterShape(N, E, k, "MoeExpertStats");
    Use();
    SSHSDP_CUDA_OK(
        cuda::LaunchMoeExpertStats(score, sel, N, E, k, opt.softmax, count, psum, stream_));
  }
  void MoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k, int32_t* row,
                  int32_t* token) override {
    CheckRouterShape(N, E, k, "MoePermute");
    if (N == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMoePermute(sel, offsets, N, E, k, row, token, stream_));
  }
  void MoeRouterBackward(const float* score, const int32_t* sel, const float* gate,
                         const float* frac, const float* dgate, int64_t N, int E, int k,
                         const kernels::MoeRouterOptions& opt, float* dz) override {
    CheckRouterShape(N, E, k, "MoeRouterBackward");
    SSHSDP_CHECK(k <= 64, NumericsError, "MoeRouterBackward on CUDA: top-k {} above 64", k);
    if (N == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMoeRouterBackward(score, sel, gate, frac, dgate, N, E, k,
                                                 opt.softmax, opt.renormalize, opt.aux_weight, dz,
                                                 stream_));
  }
  void GatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows,
                  int64_t d) override {
    CheckMoeShape(rows, 1, d, "GatherRows");
    if (rows == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchGatherRows(src, idx, dst, rows, d, stream_));
  }
  void MoeCombine(const float* yp, const int32_t* row, const float* gate, float* out, int64_t N,
                  int k, int64_t d, bool accumulate) override {
    CheckMoeShape(N, k, d, "MoeCombine");
    if (N == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMoeCombine(yp, row, gate, out, N, k, d, accumulate, stream_));
  }
  void MoeCombineBackward(const float* dy, const float* yp, const int32_t* row, const float* gate,
                          float* dgate, float* dyp, int64_t N, int k, int64_t d) override {
    CheckMoeShape(N, k, d, "MoeCombineBackward");
    if (N == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMoeCombineBackward(dy, yp, row, gate, dgate, dyp, N, k, d, stream_));
  }
  void MoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k,
                       int64_t d) override {
    CheckMoeShape(N, k, d, "MoeUnpermuteSum");
    if (N == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMoeUnpermuteSum(dxp, row, dx, N, k, d, stream_));
  }
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
            const float* b, float* c, bool accumulate) override {
    SSHSDP_CHECK(m >= 0 && n >= 0 && k >= 0, NumericsError, "Gemm: negative shape [{}, {}, {}]", m,
                 n, k);
    if (m == 0 || n == 0) return;
    Use();
    if (k == 0) {  // an empty sum: C is zero, or unchanged when accumulating
      if (!accumulate) Fill(c, m * n, 0.0f);
      return;
    }
    GemmBatched(trans_a, trans_b, m, n, k, a, 0, b, 0, c, 0, 1, accumulate ? 1.0f : 0.0f);
  }
  void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
                const bf16* b, float* c, bool accumulate) override {
    SSHSDP_CHECK(m >= 0 && n >= 0 && k >= 0, NumericsError, "GemmBf16: negative shape [{}, {}, {}]",
                 m, n, k);
    SSHSDP_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax, NumericsError,
                 "{}: GEMM dimensions past 2^31 - 1: [{}, {}, {}]", name_, m, n, k);
    if (m == 0 || n == 0) return;
    Use();
    if (k == 0) {
      if (!accumulate) Fill(c, m * n, 0.0f);
      return;
    }
    // Column-major cuBLAS computes Cᵀ = op(B)ᵀ·op(A)ᵀ on the same memory (as GemmBatched).
    // bf16 inputs, fp32 compute and output: tensor cores under the default math mode (the
    // handle's pedantic mode, kept for the fp32 products, is restored after).
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const int lda = static_cast<int>(trans_a ? m : k), ldb = static_cast<int>(trans_b ? k : n);
    SSHSDP_CUBLAS_OK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    const cublasStatus_t st =
        cublasGemmEx(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &one, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &beta, c,
                     CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    SSHSDP_CUBLAS_OK(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH));
    SSHSDP_CUBLAS_OK(st);
  }
  void MuonMomentum(const float* grad, float* m, void* u, DType u_dtype, int64_t n, float momentum,
                    bool nesterov, float grad_scale) override {
    CheckCount(n, "MuonMomentum");
    SSHSDP_CHECK(u_dtype == DType::kF32 || u_dtype == DType::kBF16, NumericsError,
                 "MuonMomentum: u must be fp32 or bf16, got {}", DTypeName(u_dtype));
    if (n == 0) return;
    Use();
    SSHSDP_CUDA_OK(cuda::LaunchMuonMomentum(grad, m, u, u_dtype == DType::kF32, n, momentum,
                                            nesterov, grad_scale, stream_));
  }
  void MuonWeightUpdate(float* w, const float* v, int64_t n, float lr,
                        float weight_decay) override {
    CheckCount(n, "MuonWeightUpdate");
    if (n == 0) return;
    Use();
    const float decay = 1.0f - lr * weight_decay;  // as update/muon.cc computes it
    SSHSDP_CUDA_OK(cuda::LaunchMuonWeightUpdate(w, v, n, decay, lr, stream_));
  }
  void NewtonSchulz(const void* const* in, DType in_dtype, float* const* out, int64_t batch,
                    int64_t rows, int64_t cols, int steps, const NsCoefficients& coef,
                    float out_scale) override {
    SSHSDP_CHECK(rows > 0 && cols > 0 && batch >= 0 && steps >= 0, NumericsError,
                 "Newton–Schulz on {} matrices [{}, {}] with {} steps", batch, rows, cols, steps);
    SSHSDP_CHECK(in_dtype == DType::kF32 || in_dtype == DType::kBF16, NumericsError,
                 "Newton–Schulz input must be fp32 or bf16, got {}", DTypeName(in_dtype));
    if (batch == 0) return;
    Use();
    const int64_t m = std::min(rows, cols), mat = rows * cols, gram = m * m;
    // Work buffers of at most 64 MiB (as the CPU's) and grids of at most 65535 matrices: larger
    // batches run in chunks.
    const int64_t per = 2 * mat + 2 * gram;
    const int64_t chunk =
        std::clamp<int64_t>(kMaxWorkFloats / per, 1, std::min<int64_t>(batch, 65535));
    const size_t bytes = static_cast<size_t>(chunk * per) * sizeof(float) +
                         static_cast<size_t>(chunk) * sizeof(float*);
    if (work_bytes_ < bytes) {
      Synchronize();
      SSHSDP_CUDA_OK(cudaFree(work_));
      work_ = nullptr;
      work_bytes_ = 0;
      SSHSDP_CUDA_OK(cudaMalloc(&work_, bytes));
      work_bytes_ = bytes;
    }
    for (int64_t b0 = 0; b0 < batch; b0 += chunk)
      NewtonSchulzChunk(in + b0, in_dtype, out + b0, std::min(chunk, batch - b0), rows, cols, steps,
                        coef, out_scale);
  }

 private:
  static constexpr int64_t kMaxWorkFloats = int64_t{16} << 20;
  static constexpr int64_t kIntMax = 2147483647;

  void Use() { SSHSDP_CUDA_OK(cudaSetDevice(ordinal_)); }

  // NewtonSchulz on `batch` matrices that fit the work buffer.
  void NewtonSchulzChunk(const void* const* in, DType in_dtype, float* const* out, int64_t batch,
                         int64_t rows, int64_t cols, int steps, const NsCoefficients& coef,
                         float out_scale) {
    const bool tall = rows > cols;
    const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
    const int64_t mat = rows * cols, gram = m * m;
    float* X = static_cast<float*>(work_);
    float* Y = X + batch * mat;
    float* A = Y + batch * mat;
    float* B = A + batch * gram;
    float** outs = reinterpret_cast<float**>(B + batch * gram);
    for (int64_t i = 0; i < batch; ++i) {  // bf16 widens exactly, as on the CPU
      if (in_dtype == DType::kBF16)
        SSHSDP_CUDA_OK(cuda::LaunchCastBf16ToF32(static_cast<const uint16_t*>(in[i]), X + i * mat,
                                                 mat, stream_));
      else
        SSHSDP_CUDA_OK(cudaMemcpyAsync(X + i * mat, in[i], mat * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream_));
    }
    SSHSDP_CUDA_OK(cuda::LaunchNormalizeMatrices(X, mat, batch, stream_));
    const int nb = static_cast<int>(batch);
    for (int s = 0; s < steps; ++s) {
      // A = X·Xᵀ (wide) or Xᵀ·X (tall); B = A·A → b·A + c·A² + a·I; X ← B·X or X·B.
      if (tall)
        GemmBatched(true, false, m, m, n, X, mat, X, mat, A, gram, nb);
      else
        GemmBatched(false, true, m, m, n, X, mat, X, mat, A, gram, nb);
      GemmBatched(false, false, m, m, m, A, gram, A, gram, B, gram, nb);
      SSHSDP_CUDA_OK(
          cuda::LaunchNsPolynomial(A, B, batch * gram, m, coef.a, coef.b, coef.c, stream_));
      if (tall)
        GemmBatched(false, false, n, m, m, X, mat, B, gram, Y, mat, nb);
      else
        GemmBatched(false, false, m, n, m, B, gram, X, mat, Y, mat, nb);
      std::swap(X, Y);
    }
    const std::vector<float*> host_outs(out, out + batch);
    CopyIn(outs, host_outs.data(), host_outs.size() * sizeof(float*));
    SSHSDP_CUDA_OK(cuda::LaunchScaleOut(X, outs, mat, batch, out_scale, stream_));
  }

  // Row-major C[M, N] = op(A)·op(B) + beta·C for `batch` matrices (strides in elements):
  // cuBLAS is column-major, so it computes Cᵀ = op(B)ᵀ·op(A)ᵀ on the same memory.
  void GemmBatched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t sa,
                   const float* b, int64_t sb, float* c, int64_t sc, int batch, float beta = 0.0f) {
    SSHSDP_CHECK(M <= kIntMax && N <= kIntMax && K <= kIntMax, NumericsError,
                 "{}: GEMM dimensions past 2^31 - 1: [{}, {}, {}]", name_, M, N, K);
    const float one = 1.0f;
    const int lda = static_cast<int>(ta ? M : K), ldb = static_cast<int>(tb ? K : N);
    SSHSDP_CUBLAS_OK(cublasSgemmStridedBatched(
        blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
        static_cast<int>(M), static_cast<int>(K), &one, b, ldb, sb, a, lda, sa, &beta, c,
        static_cast<int>(N), sc, batch));
  }
  // The attention kernels keep tiles of up to kMaxAttentionHeadDim-wide rows in shared memory
  // and put query tiles, H and B on grid dimensions.
  void CheckAttention(int B, int T, int H, int dh, const char* op) {
    CheckAttentionShape(B, T, H, dh, op);
    SSHSDP_CHECK(dh <= cuda::kMaxAttentionHeadDim && H <= 65535 && B <= 65535, NumericsError,
                 "{}: {}'s attention takes head widths dh <= {}, H and B <= 65535; got dh={} "
                 "H={} B={}",
                 op, name_, cuda::kMaxAttentionHeadDim, dh, H, B);
  }
  // 1/√dh, as kernels/attention.cc scales the scores.
  static float Scale(int dh) { return 1.0f / std::sqrt(static_cast<float>(dh)); }
  void CheckRowsFit(int64_t rows, int d, const char* op) {
    CheckRows(rows, d, op);
    SSHSDP_CHECK(rows <= kIntMax, NumericsError, "{}: {} rows, at most 2^31 - 1 per call", op,
                 rows);
  }

  int ordinal_;
  EventPool events_;  // RecordEvent's; its events must not outlive the backend (backend.h)
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* work_ = nullptr;
  size_t work_bytes_ = 0;
  double* partial_ = nullptr;
  float* attn_d_ = nullptr;  // CausalAttentionBackward: dout·out per (sequence, head, row)
  int64_t attn_d_rows_ = 0;
  double* row_loss_ = nullptr;  // SoftmaxCrossEntropyForward: per-row losses
  struct UploadSlot {
    void* host = nullptr;  // page-locked
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the slot's last copy
  };
  static constexpr int kUploadSlots = 8;  // a microbatch uploads two (tokens, targets)
  UploadSlot upload_[kUploadSlots];
  uint64_t upload_next_ = 0;
  int64_t row_loss_rows_ = 0;
};

}  // namespace

bool CudaCompiled() { return true; }

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device / no driver" status
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> MakeCudaBackend(int ordinal) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError(
        fmt::format("cuda:{}: no usable CUDA device ({}: {}); use --backend cpu on this machine",
                    ordinal, cudaGetErrorName(e), cudaGetErrorString(e)));
  }
  SSHSDP_CHECK(n > 0, DeviceError, "cuda:{}: no CUDA device is visible; use --backend cpu",
               ordinal);
  SSHSDP_CHECK(ordinal >= 0 && ordinal < n, DeviceError,
               "cuda:{}: this machine has {} CUDA device(s), ordinals 0..{}", ordinal, n, n - 1);
  return std::make_unique<CudaBackend>(ordinal);
}

}  // namespace sshsdp
