// Backends: what the models, the optimizer update and the engine compute through — memory a
// data-tree root can live in, and the ops on it: the layer ops of the models (norms,
// activations, attention, GEMMs in fp32 and bf16, embeddings, the loss, the MoE router and
// permutation), the engine's own work (the cast G, MXFP8 weight quantization, the gradient
// norm's sum of squares, fills) and the optimizers' (AdamW on ZeRO-1 fragments, Muon's momentum,
// batched Newton–Schulz and weight update). ggml's pattern: the CPU backend is the default and the
// reference (it calls the kernels/ and numerics/ functions), and every other backend is checked
// against it op by op (backend_test.cc). The layer sits just above kernels/: update/, models/
// and engine/ all take a Backend&.
//
// Pointers passed to a backend's ops are that backend's memory (Alloc); CopyIn / CopyOut move
// bytes between it and host memory and return once the host side may be reused (CopyIn's data is
// on the device, for every stream, when it returns; Upload's is queued like an op). Ops run in
// order on the backend's one compute stream and may return before they finish; CopyOut,
// SumSquares and Synchronize wait for them. A backend is used from one host thread at a time,
// except for its events (RecordEvent), which any thread may wait on.
// Element counts n must be >= 0 (NumericsError otherwise); 0 does nothing.
//
//   std::unique_ptr<Backend> b = MakeBackend("cuda");    // DeviceError if none is usable
//   float* x = static_cast<float*>(b->Alloc(n * 4));
//   b->CopyIn(x, host.data(), n * 4);
//   bf16* y = static_cast<bf16*>(b->Alloc(n * 2));
//   b->CastF32ToBf16(x, y, n);
//   b->CopyOut(out.data(), y, n * 2);                    // equals FloatToBf16 bit for bit
//   b->Free(x);  b->Free(y);
//
// What each op must equal on every backend (backend_test.cc checks it):
//   CastF32ToBf16, CastBf16ToF32, Fill,
//   MxQuantizeWeight, MxDequantizeRows[Bf16]                   bit for bit (a NaN output
//                                                              may carry another payload)
//   AdamW, MuonMomentum, MuonWeightUpdate                      bit for bit (same fp32 ops in
//                                                              the same order, no FMA)
//   SumSquares                                                 1e-12 relative (any order)
//   NewtonSchulz                                               1e-4 of the largest entry
//   EmbeddingForward/Backward, Add                             bit for bit
//   MoeTopK's sel, MoeExpertStats' count, MoePermute             bit for bit
//   MoeTopK's scores and gates, MoeRouterBackward, psum          the tolerances backend_test.cc
//                                                              states (expf, sums in another order)
//   GatherRows, MoeCombine, MoeUnpermuteSum, MoeCombineBackward's dyp   bit for bit
//   MoeCombineBackward's dgate (a dot product in another order)       1e-5 of Σ|dy·yp|
//   the other layer ops and Gemm                               the tolerances backend_test.cc
//                                                              states per op (fp32 sums in
//                                                              another order, libm-class exp)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/moe_kernels.h"
#include "sshsdp/kernels/mx_linear.h"
#include "sshsdp/kernels/newton_schulz.h"
#include "sshsdp/kernels/optimizer.h"
#include "sshsdp/kernels/rope.h"
#include "sshsdp/numerics/dtype.h"
#include "sshsdp/numerics/mx.h"
#include "sshsdp/numerics/scale_layout.h"

namespace sshsdp {

// A device backend that cannot be made or failed (no device, not compiled in, a CUDA error).
class DeviceError : public Error {
 public:
  using Error::Error;
};

// A point in one backend handle's queue of ops (Backend::RecordEvent). Wait blocks the calling
// host thread — any thread, not only the handle's — until every op queued on that handle before
// the record has run, and raises DeviceError if one failed. How the engine hands a buffer the
// compute stream wrote to its communication thread without stopping the compute thread (the
// communication thread waits, docs/design.md, One step): a cudaEvent on CUDA, nothing to wait for
// on the CPU.
class BackendEvent {
 public:
  virtual ~BackendEvent() = default;
  virtual void Wait() = 0;
};

// What a backend may lack; a model asks (Backend::Has) when it is built and refuses by name, or
// takes another way (fp32 attention where there is no bf16 attention).
enum class BackendFeature {
  kStridedGemm,     // GemmStrided: per-part QKV runtime parameters (GptConfig::packed_qkv false)
  kBf16Attention,   // CausalAttention{Forward,Backward}Bf16
  kBf16Gradients,   // bf16 gradient views (LinearBackwardWeight, WriteOrAccumulate, embeddings)
  kAnyScaleLayout,  // MXFP8 weights in every Tw layout (else row_major only)
  kRope,            // RopeQkvForward / RopeQkvBackward: the Llama family (models/llama.h)
};
const char* BackendFeatureName(BackendFeature f);

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda:<ordinal> (<device name>, sm_<cc>)".
  virtual std::string name() const = 0;
  // Whether Alloc returns ordinary host memory of this process (the CPU backend), which host
  // code and MPI may read and write; a device's memory may only be reached through the ops.
  virtual bool host_memory() const { return false; }
  // The widest attention head (dh) CausalAttentionForward / Backward take; a model checks it
  // when it is built, before any collective (Gpt, MoeGpt).
  virtual int max_attention_head_dim() const { return 1 << 30; }
  // Whether this backend has feature f (the defaults below do not).
  virtual bool Has(BackendFeature f) const {
    (void)f;
    return false;
  }

  // ---- Memory (DeviceError when an allocation fails; Alloc(0) returns nullptr; at least
  // 64-byte aligned, as a data-tree root needs). ----
  virtual void* Alloc(size_t bytes) = 0;
  // Never throws (it runs in destructors): a failure is reported on stderr.
  virtual void Free(void* p) = 0;
  virtual void CopyIn(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyOut(void* host_dst, const void* src, size_t bytes) = 0;
  // Host bytes into the backend's memory queued like an op: the host does not wait for the
  // queued work, and src may be reused once Upload returns (the backend stages it). For what a
  // microbatch brings in (its tokens), so that the host can queue ahead of the device. Default:
  // CopyIn, for a backend without a queue.
  virtual void Upload(void* dst, const void* host_src, size_t bytes) {
    CopyIn(dst, host_src, bytes);
  }
  // Within the backend's memory, queued like an op (the ranges must not overlap).
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void Synchronize() = 0;
  // Marks the ops queued on this handle so far (see BackendEvent); the caller does not wait.
  // The event must not outlive the backend.
  virtual std::shared_ptr<BackendEvent> RecordEvent() = 0;
  // Another handle on this backend's device, with a stream of its own, for a second host thread
  // (the communication thread's staging copies, device/staged_communicator.h): memory either
  // handle allocates is valid in both. The two handles' work is not ordered: the caller
  // synchronizes where one reads what the other wrote.
  virtual std::unique_ptr<Backend> NewStream() = 0;
  // Host memory this device copies to and from at full speed (page-locked on CUDA, ordinary
  // 64-byte aligned memory on the CPU), for staging buffers; AllocHost(0) returns nullptr.
  // DeviceError when it cannot be allocated; FreeHost never throws.
  virtual void* AllocHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;

  // ---- Ops on backend memory; n may be 0. ----
  virtual void Fill(float* x, int64_t n, float value) = 0;
  // `bytes` zero bytes at x (any dtype's +0; the padding of a bf16 or fp32 buffer).
  virtual void Zero(void* x, size_t bytes) = 0;
  // y = bf16(x), round to nearest even (the cast G); NaN stays NaN.
  virtual void CastF32ToBf16(const float* x, bf16* y, int64_t n) = 0;
  virtual void CastBf16ToF32(const bf16* x, float* y, int64_t n) = 0;
  // One AdamW step (update/adamw.h) over `count` spans whose w, g, m, v are backend memory
  // (the span array itself is host memory).
  virtual void AdamW(const AdamWSpan* spans, int count, const AdamWConfig& cfg, int64_t step,
                     float grad_scale) = 0;
  // numerics/mx.h's MxQuantizeWeight: row-major [rows, cols] fp32 to FP8 codes q [rows, cols]
  // and UE8M0 scales [ceil(rows/32), ceil(cols/32)] of 32x32 blocks (the G stage of MXFP8
  // runtime weights). NumericsError for bad options or a negative shape.
  virtual void MxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q,
                                uint8_t* scales, const MxOptions& opt) = 0;
  // The inverse with one scale per row and 32-column block: scales [rows, ceil(cols/32)] row-major
  // (numerics/mx.h's MxDequantizeActivation; Tw's ScaleLayout::kRowMajor of a packed runtime
  // weight, where each 32x32 block scale is repeated on the rows it covers). The engine on a
  // GPU without an MX GEMM dequantizes its MXFP8 runtime weights with it (the defaults of
  // LinearForward and MxDequantizeOperand; models/gpt.h's --mx-gemm bf16 with the next one).
  virtual void MxDequantizeRows(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                                float* out, const MxOptions& opt) = 0;
  // The same values rounded to bf16 (round to nearest even) in one pass: bf16 GEMMs' operand
  // (--mx-gemm bf16) without the fp32 copy. Equals CastF32ToBf16 of MxDequantizeRows.
  virtual void MxDequantizeRowsBf16(const uint8_t* q, const uint8_t* scales, int64_t rows,
                                    int64_t cols, bf16* out, const MxOptions& opt) = 0;
  // Σ x[i]² in double (the gradient norm's partial sum); waits for the result.
  virtual double SumSquares(const float* x, int64_t n) = 0;
  // ---- The reference GPT's layer ops on fp32 activations (kernels/layer_kernels.h and
  // kernels/matmul.h: the same contracts). ----
  // eps: kernels::kRmsEps for the GPT, the config's rms_norm_eps for the Llama family.
  virtual void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows,
                              int d, float eps) = 0;
  virtual void RmsNormBackward(const float* dy, const float* x, const float* g, const float* rstd,
                               float* dx, float* dg, int64_t rows, int d, bool accumulate_dx) = 0;
  virtual void GeluForward(const float* x, float* y, int64_t n) = 0;
  virtual void GeluBackwardInPlace(const float* x, float* dy, int64_t n) = 0;
  virtual void SwigluForward(const float* h1, const float* h3, float* a, int64_t n) = 0;
  virtual void SwigluBackward(const float* h1, const float* h3, const float* da, float* dh1,
                              float* dh3, int64_t n) = 0;
  // Logits become probabilities in place, losses[r] per row, and *total = Σ losses in double
  // (total: one double of the backend's memory). Nothing is read back: a caller reads the total
  // with CopyOut when it needs the value (the engine once per step, not per microbatch).
  virtual void SoftmaxCrossEntropyForward(float* logits, const int32_t* targets, float* losses,
                                          int64_t rows, int64_t V, int64_t ld, double* total) = 0;
  virtual void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets,
                                           float* dlogits, int64_t rows, int64_t ld,
                                           float scale) = 0;
  // kernels/layer_kernels.h's fp32 embeddings (tokens in backend memory, each < vocab); a null
  // wpe / dwpe: no position table (the Llama family).
  virtual void EmbeddingForward(const float* wte, const float* wpe, const int32_t* tokens, int B,
                                int T, int d, float* out) = 0;
  virtual void EmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d,
                                 float* dwte, int64_t vocab, float* dwpe, int64_t seq_len,
                                 bool accumulate) = 0;
  // kernels/attention.h's causal attention over the packed QKV activation [B·T, 3d]:
  // out [B·T, d], lse [B, H, T] (forward), dqkv [B·T, 3d] overwritten (backward).
  virtual void CausalAttentionForward(const float* qkv, float* out, float* lse, int B, int T, int H,
                                      int dh) = 0;
  virtual void CausalAttentionBackward(const float* dout, const float* qkv, const float* out,
                                       const float* lse, float* dqkv, int B, int T, int H,
                                       int dh) = 0;
  // y = a + b (y may alias a or b): the residual adds.
  virtual void Add(const float* a, const float* b, float* y, int64_t n) = 0;
  // Row-major fp32 C[m, n] (=|+=) op(A)·op(B): A stored [m, k] ([k, m] when trans_a), B [k, n]
  // ([n, k] when trans_b) — the linear layers' forward, data and weight-gradient products.
  virtual void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                    const float* b, float* c, bool accumulate) = 0;
  // The same product of bf16 A and B, accumulated in fp32 into fp32 C (kernels/matmul.h's Gemm
  // with bf16 operands; on CUDA a bf16 tensor-core product with fp32 compute) — the linear
  // layers' products with bf16 runtime weights.
  virtual void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
                        const bf16* b, float* c, bool accumulate) = 0;

  // ---- The linear layers on typed operands (kernels/matmul.h's and kernels/mx_linear.h's
  // Linear* contracts): x / dy fp32, or bf16 already rounded (with a bf16 weight only); the
  // weight fp32, bf16, or MXFP8 codes with Tw-relaid scales. The CPU backend runs the kernels
  // themselves; the defaults compose Gemm / GemmBf16 / casts / MxDequantizeRows in this
  // backend's scratch: the same values rounded once, products in the backend's own order,
  // MXFP8 from row_major scales only and fp32 gradients only (DeviceError naming the op
  // otherwise; a model asks Has() first). ----
  virtual void LinearForward(kernels::LinearInput x, const kernels::WeightView& w, float* y,
                             int64_t m, int64_t n, int64_t k);
  virtual void LinearBackwardData(kernels::LinearInput dy, const kernels::WeightView& w, float* dx,
                                  int64_t m, int64_t n, int64_t k, bool accumulate);
  // dw [n, k] (=|+=) dyᵀ·x in compute_dtype (kernels::LinearComputeDType of the weight); dw fp32
  // or bf16 (kBf16Gradients).
  virtual void LinearBackwardWeight(kernels::LinearInput dy, kernels::LinearInput x,
                                    DType compute_dtype, void* dw, DType dw_dtype, int64_t m,
                                    int64_t n, int64_t k, bool accumulate);
  // kernels::GemmStrided (kStridedGemm): operands inside larger row-major arrays.
  virtual void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                           const void* a, int64_t lda, const void* b, int64_t ldb, DType ab_dtype,
                           void* c, int64_t ldc, DType c_dtype, bool accumulate);
  // The layer ops that store a bf16 linear input (kernels/layer_kernels.h's *Bf16): the fp32
  // results rounded once. Defaults: the fp32 op into scratch, then CastF32ToBf16.
  virtual void RmsNormForwardBf16(const float* x, const float* g, bf16* y, float* rstd,
                                  int64_t rows, int d, float eps);
  virtual void GeluForwardBf16(const float* x, bf16* y, int64_t n);
  virtual void GeluBackwardBf16(const float* x, const float* dy, bf16* dx, int64_t n);
  virtual void SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets,
                                               bf16* dlogits, int64_t rows, int64_t ld,
                                               float scale);
  // Attention on bf16 operands (kernels/attention.h's *Bf16, kBf16Attention); `scratch` holds
  // AttentionBf16ScratchFloats floats of this backend's memory.
  virtual int64_t AttentionBf16ScratchFloats(int B, int T, int H, int dh) const;
  virtual void CausalAttentionForwardBf16(const float* qkv, float* out, float* lse, float* scratch,
                                          int64_t scratch_floats, int B, int T, int H, int dh);
  virtual void CausalAttentionBackwardBf16(const float* dout, const float* qkv, const float* out,
                                           const float* lse, float* dqkv, float* scratch,
                                           int64_t scratch_floats, int B, int T, int H, int dh);
  // kernels/rope.h's QK-norm, RoPE and GQA head sharing (kRope): raw [rows, (Hq + 2·Hkv)·dh]
  // to attention's packed [rows, 3·Hq·dh] and back; cos / sin [T, dh/2], the gains [dh] (null:
  // no QK-norm), rstd [rows, Hq + Hkv], all backend memory.
  virtual void RopeQkvForward(const float* raw, const float* cos, const float* sin,
                              const float* q_gain, const float* k_gain, float eps, float* att,
                              float* rstd, const kernels::RopeShape& s);
  virtual void RopeQkvBackward(const float* datt, const float* raw, const float* cos,
                               const float* sin, const float* q_gain, const float* k_gain,
                               const float* rstd, float* draw, float* dq_gain, float* dk_gain,
                               const kernels::RopeShape& s);
  // Embeddings of fp32 or bf16 tables (tables' dtype `dt`): rows read as fp32, out fp32.
  // wte has `vocab` rows, wpe `seq_len`.
  virtual void EmbeddingForwardTyped(const void* wte, const void* wpe, DType dt,
                                     const int32_t* tokens, int B, int T, int d, int64_t vocab,
                                     int64_t seq_len, float* out);
  // Into fp32 or bf16 gradient tables (bf16: kBf16Gradients; summed in fp32 in `scratch`,
  // (vocab + seq_len)·d floats of this backend's memory, and rounded once; null when both are
  // fp32). Overwrite gives rows that never occur explicit zeros.
  virtual void EmbeddingBackwardTyped(const float* dx, const int32_t* tokens, int B, int T, int d,
                                      void* dwte, DType dwte_dtype, int64_t vocab, void* dwpe,
                                      DType dwpe_dtype, int64_t seq_len, bool accumulate,
                                      float* scratch);
  // dst (fp32, or bf16: kBf16Gradients) = or += src (kernels::WriteOrAccumulate).
  virtual void WriteOrAccumulate(const float* src, void* dst, DType dst_dtype, int64_t n,
                                 bool accumulate);
  // kernels::MxDequantizeOperand: MXFP8 codes [mn, k] with scales in `layout` as fp32 (row_major
  // only unless kAnyScaleLayout).
  virtual void MxDequantizeOperand(const uint8_t* codes, DType elem, const uint8_t* scales,
                                   ScaleLayout layout, int64_t mn, int64_t k, float* out);

  // ---- The MoE router (kernels/moe_kernels.h's MoeTopK, MoeExpertStats, MoePermute and
  // MoeRouterBackward: the same contracts, every array in backend memory; 1 <= k <= E). The
  // host keeps step 3 (MoeBalance: E counts in, the offsets and f_e out). ----
  virtual void MoeTopK(float* score, int64_t N, int E, int k, const kernels::MoeRouterOptions& opt,
                       int32_t* sel, float* gate) = 0;
  virtual void MoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                              const kernels::MoeRouterOptions& opt, int32_t* count,
                              double* psum) = 0;
  virtual void MoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k,
                          int32_t* row, int32_t* token) = 0;
  virtual void MoeRouterBackward(const float* score, const int32_t* sel, const float* gate,
                                 const float* frac, const float* dgate, int64_t N, int E, int k,
                                 const kernels::MoeRouterOptions& opt, float* dz) = 0;
  // ---- The MoE GPT's permutation ops (kernels/moe_kernels.h: the same contracts; rows of d
  // floats, indices and gates in backend memory, each index in range). ----
  // dst[r] = src[idx[r]], r < rows.
  virtual void GatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows,
                          int64_t d) = 0;
  // out[t] (=|+=) Σ_j gate[t·k+j] · yp[row[t·k+j]], t < N, j < k in order.
  virtual void MoeCombine(const float* yp, const int32_t* row, const float* gate, float* out,
                          int64_t N, int k, int64_t d, bool accumulate) = 0;
  // dgate[t·k+j] = ⟨dy[t], yp[row[t·k+j]]⟩ and dyp[row[t·k+j]] = gate[t·k+j] · dy[t].
  virtual void MoeCombineBackward(const float* dy, const float* yp, const int32_t* row,
                                  const float* gate, float* dgate, float* dyp, int64_t N, int k,
                                  int64_t d) = 0;
  // dx[t] = Σ_j dxp[row[t·k+j]], j < k in order.
  virtual void MoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k,
                               int64_t d) = 0;

  // out[i] = out_scale · NS(in[i]) for i < batch, [rows, cols] row-major matrices, in[i] fp32
  // or bf16 (in_dtype; NumericsError otherwise), out[i] fp32 (kernels/newton_schulz.h: the same
  // iteration and normalisation). The matrices are backend memory; the pointer arrays `in` and
  // `out` are host memory.
  virtual void NewtonSchulz(const void* const* in, DType in_dtype, float* const* out, int64_t batch,
                            int64_t rows, int64_t cols, int steps, const NsCoefficients& coef,
                            float out_scale) = 0;
  // Muon's elementwise stages (update/muon.h's MuonMomentum and MuonWeightUpdate) on one
  // piece: grad, m and u (u_dtype: fp32 or bf16), w and v in backend memory.
  virtual void MuonMomentum(const float* grad, float* m, void* u, DType u_dtype, int64_t n,
                            float momentum, bool nesterov, float grad_scale) = 0;
  virtual void MuonWeightUpdate(float* w, const float* v, int64_t n, float lr,
                                float weight_decay) = 0;

 protected:
  // Backend memory for the defaults' intermediates: slot i grown to `bytes` and kept (a growth
  // frees the old block, which on a device waits for its queued users). A backend that uses the
  // defaults calls ReleaseScratch in its destructor, while its Free still works.
  void* Scratch(int slot, size_t bytes);
  void ReleaseScratch();

 private:
  struct ScratchBlock {
    void* p = nullptr;
    size_t bytes = 0;
  };
  ScratchBlock scratch_[3];
};

// NumericsError naming the op unless n >= 0 (every backend checks its counts with it).
inline void CheckCount(int64_t n, const char* op) {
  SSHSDP_CHECK(n >= 0, NumericsError, "{}: element count must be >= 0, got {}", op, n);
}

// NumericsError naming the op unless N >= 0 and 1 <= k <= E (the MoE router's ops).
inline void CheckRouterShape(int64_t N, int E, int k, const char* op) {
  SSHSDP_CHECK(N >= 0 && k >= 1 && k <= E, NumericsError,
               "{}: need N >= 0 and 1 <= k <= E, got N={} E={} k={}", op, N, E, k);
}

// NumericsError naming the op unless N >= 0, k >= 1 and the row width d > 0 (the MoE ops).
inline void CheckMoeShape(int64_t N, int k, int64_t d, const char* op) {
  SSHSDP_CHECK(N >= 0 && k >= 1 && d > 0, NumericsError,
               "{}: need N >= 0, k >= 1 and a row width > 0, got N={} k={} width={}", op, N, k, d);
}

// An MXFP8 op's arguments: the options (CheckMxOptions) and a [rows, cols] shape, both >= 0
// (NumericsError naming the op).
inline void CheckMxCall(const MxOptions& opt, int64_t rows, int64_t cols, const char* op) {
  CheckMxOptions(opt);
  SSHSDP_CHECK(rows >= 0 && cols >= 0, NumericsError,
               "{}: matrix shape must be non-negative, got [{}, {}]", op, rows, cols);
}

// NumericsError naming the op unless rows >= 0 and the row width d > 0.
inline void CheckRows(int64_t rows, int d, const char* op) {
  CheckCount(rows, op);
  SSHSDP_CHECK(d > 0, NumericsError, "{}: row width must be > 0, got {}", op, d);
}

// NumericsError naming the op unless B, T >= 0 and the row width d > 0.
inline void CheckShape(int B, int T, int d, const char* op) {
  SSHSDP_CHECK(B >= 0 && T >= 0 && d > 0, NumericsError,
               "{}: need B, T >= 0 and a row width > 0, got B={} T={} width={}", op, B, T, d);
}

// NumericsError unless H, dh > 0, B, T >= 0 and the packed QKV row (3·H·dh) fits an int.
inline void CheckAttentionShape(int B, int T, int H, int dh, const char* op) {
  SSHSDP_CHECK(H > 0 && dh > 0 && int64_t{3} * H * dh <= 2147483647, NumericsError,
               "{}: need H, dh > 0 and 3·H·dh < 2^31, got H={} dh={}", op, H, dh);
  CheckShape(B, T, H * dh, op);
}

// The reference backend: host memory, the numerics/ and update/ functions.
std::unique_ptr<Backend> MakeCpuBackend();
// CUDA device `ordinal`. DeviceError naming the reason when sshsdp was built without CUDA
// (-DSSHSDP_CUDA=ON), no device is visible, or the ordinal is out of range.
std::unique_ptr<Backend> MakeCudaBackend(int ordinal = 0);
// "cpu", "cuda" or "cuda:<ordinal>"; DeviceError (as above) or ConfigError for another name.
std::unique_ptr<Backend> MakeBackend(std::string_view name);

// Whether this build has the CUDA backend, and how many CUDA devices it can see (0 without
// CUDA, without a driver, or without a device; never throws).
bool CudaCompiled();
int CudaDeviceCount();

}  // namespace sshsdp
