// The CPU backend (backend.h): host memory and the functions the engine runs today — the
// reference every other backend is checked against. Also the backend factory, which needs
// no CUDA: MakeCudaBackend is defined by cuda_backend.cc, or by no_cuda.cc without CUDA.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/kernels/attention.h"
#include "sshsdp/kernels/elementwise.h"
#include "sshsdp/kernels/layer_kernels.h"
#include "sshsdp/kernels/matmul.h"
#include "sshsdp/kernels/moe_kernels.h"
#include "sshsdp/kernels/mx_linear.h"

namespace sshsdp {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool Has(BackendFeature) const override { return true; }

  void* Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    // 64-byte aligned, as data-tree roots require (a GPU allocator gives 256).
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    SSHSDP_CHECK(p != nullptr, DeviceError, "cpu: cannot allocate {} bytes", bytes);
    return p;
  }
  void Free(void* p) override { std::free(p); }
  void CopyIn(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void CopyOut(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  bool host_memory() const override { return true; }
  void Synchronize() override {}
  // Ops run before they return: every event has happened when it is recorded.
  std::shared_ptr<BackendEvent> RecordEvent() override {
    struct Done final : BackendEvent {
      void Wait() override {}
    };
    static const auto done = std::make_shared<Done>();
    return done;
  }
  std::unique_ptr<Backend> NewStream() override { return std::make_unique<CpuBackend>(); }
  void* AllocHost(size_t bytes) override { return Alloc(bytes); }
  void FreeHost(void* p) override { std::free(p); }

  void Fill(float* x, int64_t n, float value) override {
    CheckCount(n, "Fill");
    kernels::Fill(x, n, value);
  }
  void Zero(void* x, size_t bytes) override {
    if (bytes) std::memset(x, 0, bytes);
  }
  void CastF32ToBf16(const float* x, bf16* y, int64_t n) override {
    CheckCount(n, "CastF32ToBf16");
    kernels::CastToBf16(x, y, n);
  }
  void CastBf16ToF32(const bf16* x, float* y, int64_t n) override {
    CheckCount(n, "CastBf16ToF32");
    Bf16ToFloat(x, y, static_cast<size_t>(n));
  }
  void AdamW(const AdamWSpan* spans, int count, const AdamWConfig& cfg, int64_t step,
             float grad_scale) override {
    for (int i = 0; i < count; ++i) CheckCount(spans[i].n, "AdamW");
    AdamWStep(std::vector<AdamWSpan>(spans, spans + count), cfg, step, grad_scale);
  }
  void MxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scales,
                        const MxOptions& opt) override {
    sshsdp::MxQuantizeWeight(w, rows, cols, q, scales, opt);
  }
  void MxDequantizeRows(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                        float* out, const MxOptions& opt) override {
    CheckMxOptions(opt);
    sshsdp::MxDequantizeActivation(q, scales, rows, cols, out, opt);
  }
  void MxDequantizeRowsBf16(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                            bf16* out, const MxOptions& opt) override {
    CheckMxCall(opt, rows, cols, "MxDequantizeRowsBf16");
    std::vector<float> row(static_cast<size_t>(cols));  // one row at a time
    const int64_t kb = (cols + 31) / 32;
    for (int64_t r = 0; r < rows; ++r) {
      sshsdp::MxDequantizeActivation(q + r * cols, scales + r * kb, 1, cols, row.data(), opt);
      FloatToBf16(row.data(), out + r * cols, static_cast<size_t>(cols));
    }
  }
  double SumSquares(const float* x, int64_t n) override {
    CheckCount(n, "SumSquares");
    return kernels::SumSquares(x, n);
  }
  void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d,
                      float eps) override {
    CheckRows(rows, d, "RmsNormForward");
    kernels::RmsNormForward(x, g, y, rstd, rows, d, eps);
  }
  void RmsNormBackward(const float* dy, const float* x, const float* g, const float* rstd,
                       float* dx, float* dg, int64_t rows, int d, bool accumulate_dx) override {
    CheckRows(rows, d, "RmsNormBackward");
    kernels::RmsNormBackward(dy, x, g, rstd, dx, dg, rows, d, accumulate_dx);
  }
  void GeluForward(const float* x, float* y, int64_t n) override {
    CheckCount(n, "GeluForward");
    kernels::GeluForward(x, y, n);
  }
  void GeluBackwardInPlace(const float* x, float* dy, int64_t n) override {
    CheckCount(n, "GeluBackwardInPlace");
    kernels::GeluBackwardInPlace(x, dy, n);
  }
  void SwigluForward(const float* h1, const float* h3, float* a, int64_t n) override {
    CheckCount(n, "SwigluForward");
    kernels::SwigluForward(h1, h3, a, n);
  }
  void SwigluBackward(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                      int64_t n) override {
    CheckCount(n, "SwigluBackward");
    kernels::SwigluBackward(h1, h3, da, dh1, dh3, n);
  }
  void SoftmaxCrossEntropyForward(float* logits, const int32_t* targets, float* losses,
                                  int64_t rows, int64_t V, int64_t ld, double* total) override {
    CheckCount(rows, "SoftmaxCrossEntropyForward");
    SSHSDP_CHECK(V >= 1 && V <= ld, NumericsError,
                 "SoftmaxCrossEntropyForward: need 1 <= V <= ld, got V={} ld={}", V, ld);
    SSHSDP_CHECK(total != nullptr, NumericsError,
                 "SoftmaxCrossEntropyForward: no total (a double of the backend's memory)");
    *total = kernels::SoftmaxCrossEntropyForward(logits, targets, losses, rows, V, ld);
  }
  void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits,
                                   int64_t rows, int64_t ld, float scale) override {
    CheckCount(rows, "SoftmaxCrossEntropyBackward");
    kernels::SoftmaxCrossEntropyBackward(probs, targets, dlogits, rows, ld, scale);
  }
  void EmbeddingForward(const float* wte, const float* wpe, const int32_t* tokens, int B, int T,
                        int d, float* out) override {
    CheckShape(B, T, d, "EmbeddingForward");
    kernels::EmbeddingForwardF32(wte, wpe, tokens, B, T, d, out);
  }
  void EmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d, float* dwte,
                         int64_t vocab, float* dwpe, int64_t seq_len, bool accumulate) override {
    CheckShape(B, T, d, "EmbeddingBackward");
    kernels::EmbeddingBackwardF32(dx, tokens, B, T, d, dwte, vocab, dwpe, seq_len, accumulate);
  }
  void CausalAttentionForward(const float* qkv, float* out, float* lse, int B, int T, int H,
                              int dh) override {
    CheckAttentionShape(B, T, H, dh, "CausalAttentionForward");
    attention_scratch_.resize(static_cast<size_t>(kernels::AttentionScratchFloats(B, T, H)));
    kernels::CausalAttentionForward(qkv, out, lse, attention_scratch_.data(), B, T, H, dh);
  }
  void CausalAttentionBackward(const float* dout, const float* qkv, const float* out,
                               const float* lse, float* dqkv, int B, int T, int H,
                               int dh) override {
    CheckAttentionShape(B, T, H, dh, "CausalAttentionBackward");
    attention_scratch_.resize(static_cast<size_t>(kernels::AttentionScratchFloats(B, T, H)));
    kernels::CausalAttentionBackward(dout, qkv, out, lse, dqkv, attention_scratch_.data(), B, T, H,
                                     dh);
  }
  void Add(const float* a, const float* b, float* y, int64_t n) override {
    CheckCount(n, "Add");
    kernels::AddThreaded(a, b, y, n);
  }
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
            const float* b, float* c, bool accumulate) override {
    SSHSDP_CHECK(m >= 0 && n >= 0 && k >= 0, NumericsError, "Gemm: negative shape [{}, {}, {}]", m,
                 n, k);
    kernels::Gemm(trans_a, trans_b, m, n, k, a, b, DType::kF32, c, DType::kF32, accumulate);
  }
  void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
                const bf16* b, float* c, bool accumulate) override {
    SSHSDP_CHECK(m >= 0 && n >= 0 && k >= 0, NumericsError, "GemmBf16: negative shape [{}, {}, {}]",
                 m, n, k);
    kernels::Gemm(trans_a, trans_b, m, n, k, a, b, DType::kBF16, c, DType::kF32, accumulate);
  }
  // The typed layer ops: the kernels the models were written on, so a model on this backend
  // computes their bits.
  void LinearForward(kernels::LinearInput x, const kernels::WeightView& w, float* y, int64_t m,
                     int64_t n, int64_t k) override {
    kernels::LinearForward(x, w, y, m, n, k);
  }
  void LinearBackwardData(kernels::LinearInput dy, const kernels::WeightView& w, float* dx,
                          int64_t m, int64_t n, int64_t k, bool accumulate) override {
    kernels::LinearBackwardData(dy, w, dx, m, n, k, accumulate);
  }
  void LinearBackwardWeight(kernels::LinearInput dy, kernels::LinearInput x, DType compute_dtype,
                            void* dw, DType dw_dtype, int64_t m, int64_t n, int64_t k,
                            bool accumulate) override {
    kernels::LinearBackwardWeight(dy, x, compute_dtype, dw, dw_dtype, m, n, k, accumulate);
  }
  void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                   int64_t lda, const void* b, int64_t ldb, DType ab_dtype, void* c, int64_t ldc,
                   DType c_dtype, bool accumulate) override {
    kernels::GemmStrided(trans_a, trans_b, m, n, k, a, lda, b, ldb, ab_dtype, c, ldc, c_dtype,
                         accumulate);
  }
  void RmsNormForwardBf16(const float* x, const float* g, bf16* y, float* rstd, int64_t rows, int d,
                          float eps) override {
    CheckRows(rows, d, "RmsNormForwardBf16");
    kernels::RmsNormForwardBf16(x, g, y, rstd, rows, d, eps);
  }
  void GeluForwardBf16(const float* x, bf16* y, int64_t n) override {
    CheckCount(n, "GeluForwardBf16");
    kernels::GeluForwardBf16(x, y, n);
  }
  void GeluBackwardBf16(const float* x, const float* dy, bf16* dx, int64_t n) override {
    CheckCount(n, "GeluBackwardBf16");
    kernels::GeluBackwardBf16(x, dy, dx, n);
  }
  void SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets, bf16* dlogits,
                                       int64_t rows, int64_t ld, float scale) override {
    CheckCount(rows, "SoftmaxCrossEntropyBackwardBf16");
    kernels::SoftmaxCrossEntropyBackwardBf16(probs, targets, dlogits, rows, ld, scale);
  }
  int64_t AttentionBf16ScratchFloats(int B, int T, int H, int dh) const override {
    return kernels::AttentionBf16ScratchFloats(B, T, H, dh);
  }
  void CausalAttentionForwardBf16(const float* qkv, float* out, float* lse, float* scratch,
                                  int64_t scratch_floats, int B, int T, int H, int dh) override {
    CheckAttentionShape(B, T, H, dh, "CausalAttentionForwardBf16");
    kernels::CausalAttentionForwardBf16(qkv, out, lse, scratch, scratch_floats, B, T, H, dh);
  }
  void CausalAttentionBackwardBf16(const float* dout, const float* qkv, const float* out,
                                   const float* lse, float* dqkv, float* scratch,
                                   int64_t scratch_floats, int B, int T, int H, int dh) override {
    CheckAttentionShape(B, T, H, dh, "CausalAttentionBackwardBf16");
    kernels::CausalAttentionBackwardBf16(dout, qkv, out, lse, dqkv, scratch, scratch_floats, B, T,
                                         H, dh);
  }
  void RopeQkvForward(const float* raw, const float* cos, const float* sin, const float* q_gain,
                      const float* k_gain, float eps, float* att, float* rstd,
                      const kernels::RopeShape& s) override {
    kernels::RopeQkvForward(raw, cos, sin, q_gain, k_gain, eps, att, rstd, s);
  }
  void RopeQkvBackward(const float* datt, const float* raw, const float* cos, const float* sin,
                       const float* q_gain, const float* k_gain, const float* rstd, float* draw,
                       float* dq_gain, float* dk_gain, const kernels::RopeShape& s) override {
    kernels::RopeQkvBackward(datt, raw, cos, sin, q_gain, k_gain, rstd, draw, dq_gain, dk_gain, s);
  }
  void EmbeddingForwardTyped(const void* wte, const void* wpe, DType dt, const int32_t* tokens,
                             int B, int T, int d, int64_t vocab, int64_t seq_len,
                             float* out) override;
  void EmbeddingBackwardTyped(const float* dx, const int32_t* tokens, int B, int T, int d,
                              void* dwte, DType dwte_dtype, int64_t vocab, void* dwpe,
                              DType dwpe_dtype, int64_t seq_len, bool accumulate,
                              float* scratch) override;
  void WriteOrAccumulate(const float* src, void* dst, DType dst_dtype, int64_t n,
                         bool accumulate) override {
    CheckCount(n, "WriteOrAccumulate");
    kernels::WriteOrAccumulate(src, dst, dst_dtype, n, accumulate);
  }
  void MxDequantizeOperand(const uint8_t* codes, DType elem, const uint8_t* scales,
                           ScaleLayout layout, int64_t mn, int64_t k, float* out) override {
    kernels::MxDequantizeOperand(codes, elem, scales, layout, mn, k, out);
  }

  void MoeTopK(float* score, int64_t N, int E, int k, const kernels::MoeRouterOptions& opt,
               int32_t* sel, float* gate) override {
    CheckRouterShape(N, E, k, "MoeTopK");
    kernels::MoeTopK(score, N, E, k, opt, sel, gate);
  }
  void MoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                      const kernels::MoeRouterOptions& opt, int32_t* count, double* psum) override {
    CheckRouterShape(N, E, k, "MoeExpertStats");
    kernels::MoeExpertStats(score, sel, N, E, k, opt, count, psum);
  }
  void MoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k, int32_t* row,
                  int32_t* token) override {
    CheckRouterShape(N, E, k, "MoePermute");
    kernels::MoePermute(sel, offsets, N, E, k, row, token);
  }
  void MoeRouterBackward(const float* score, const int32_t* sel, const float* gate,
                         const float* frac, const float* dgate, int64_t N, int E, int k,
                         const kernels::MoeRouterOptions& opt, float* dz) override {
    CheckRouterShape(N, E, k, "MoeRouterBackward");
    kernels::MoeRouterBackward(score, sel, gate, frac, dgate, N, E, k, opt, dz);
  }
  void GatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows,
                  int64_t d) override {
    CheckMoeShape(rows, 1, d, "GatherRows");
    kernels::MoeGatherRows(src, idx, dst, rows, d);
  }
  void MoeCombine(const float* yp, const int32_t* row, const float* gate, float* out, int64_t N,
                  int k, int64_t d, bool accumulate) override {
    CheckMoeShape(N, k, d, "MoeCombine");
    kernels::MoeCombine(yp, row, gate, out, N, k, d, accumulate);
  }
  void MoeCombineBackward(const float* dy, const float* yp, const int32_t* row, const float* gate,
                          float* dgate, float* dyp, int64_t N, int k, int64_t d) override {
    CheckMoeShape(N, k, d, "MoeCombineBackward");
    kernels::MoeCombineBackward(dy, yp, row, gate, dgate, dyp, N, k, d);
  }
  void MoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k,
                       int64_t d) override {
    CheckMoeShape(N, k, d, "MoeUnpermuteSum");
    kernels::MoeUnpermuteSum(dxp, row, dx, N, k, d);
  }
  void NewtonSchulz(const void* const* in, DType in_dtype, float* const* out, int64_t batch,
                    int64_t rows, int64_t cols, int steps, const NsCoefficients& coef,
                    float out_scale) override {
    ns_.Run(in, in_dtype, out, batch, rows, cols, steps, coef, out_scale);
  }
  void MuonMomentum(const float* grad, float* m, void* u, DType u_dtype, int64_t n, float momentum,
                    bool nesterov, float grad_scale) override {
    sshsdp::MuonMomentum(grad, m, u, u_dtype, n, momentum, nesterov, grad_scale);
  }
  void MuonWeightUpdate(float* w, const float* v, int64_t n, float lr,
                        float weight_decay) override {
    sshsdp::MuonWeightUpdate(w, v, n, lr, weight_decay);
  }

 private:
  sshsdp::NewtonSchulz ns_;
  std::vector<float> attention_scratch_;
};

// Row `row` of a [rows, d] fp32 / bf16 table as fp32.
void LoadRow(const void* table, DType dt, int64_t row, int d, float* out) {
  if (dt == DType::kF32) {
    std::memcpy(out, static_cast<const float*>(table) + row * d, static_cast<size_t>(d) * 4);
  } else {
    Bf16ToFloat(static_cast<const bf16*>(table) + row * d, out, static_cast<size_t>(d));
  }
}

void CpuBackend::EmbeddingForwardTyped(const void* wte, const void* wpe, DType dt,
                                       const int32_t* tokens, int B, int T, int d, int64_t, int64_t,
                                       float* out) {
  CheckShape(B, T, d, "EmbeddingForwardTyped");
  if (dt == DType::kF32) {
    kernels::EmbeddingForwardF32(static_cast<const float*>(wte), static_cast<const float*>(wpe),
                                 tokens, B, T, d, out);
    return;
  }
  std::vector<float> pos(static_cast<size_t>(d));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* x = out + (static_cast<int64_t>(b) * T + t) * d;
      LoadRow(wte, dt, tokens[static_cast<int64_t>(b) * T + t], d, x);
      if (wpe == nullptr) continue;
      LoadRow(wpe, dt, t, d, pos.data());
      for (int i = 0; i < d; ++i) x[i] += pos[static_cast<size_t>(i)];
    }
}

// The scatter-add is kernels::EmbeddingBackwardF32's, into fp32 tables: a view itself when it is
// fp32 (zeroed first unless accumulating, so rows that never occur get explicit zeros), else a
// zeroed part of `scratch` written once at the end, so bf16 rounding happens once per element.
void CpuBackend::EmbeddingBackwardTyped(const float* dx, const int32_t* tokens, int B, int T, int d,
                                        void* dwte, DType dwte_dtype, int64_t vocab, void* dwpe,
                                        DType dwpe_dtype, int64_t seq_len, bool accumulate,
                                        float* scratch) {
  CheckShape(B, T, d, "EmbeddingBackwardTyped");
  const int64_t n_te = vocab * d, n_pe = seq_len * d;
  const bool te_direct = dwte_dtype == DType::kF32, pe_direct = dwpe_dtype == DType::kF32;
  SSHSDP_CHECK((te_direct && pe_direct) || scratch != nullptr, NumericsError,
               "EmbeddingBackwardTyped: a bf16 gradient table needs (vocab + seq_len)·d floats "
               "of scratch");
  float* te = te_direct ? static_cast<float*>(dwte) : scratch;
  float* pe = pe_direct ? static_cast<float*>(dwpe) : scratch + (te_direct ? 0 : n_te);
  if (!te_direct || !accumulate) kernels::Fill(te, n_te, 0.0f);
  if (dwpe == nullptr) pe = nullptr;
  if (pe && (!pe_direct || !accumulate)) kernels::Fill(pe, n_pe, 0.0f);
  kernels::EmbeddingBackwardF32(dx, tokens, B, T, d, te, vocab, pe, seq_len, /*accumulate=*/true);
  if (!te_direct) kernels::WriteOrAccumulate(te, dwte, dwte_dtype, n_te, accumulate);
  if (pe && !pe_direct) kernels::WriteOrAccumulate(pe, dwpe, dwpe_dtype, n_pe, accumulate);
}

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

std::unique_ptr<Backend> MakeBackend(std::string_view name) {
  if (name == "cpu") return MakeCpuBackend();
  if (name == "cuda") return MakeCudaBackend(0);
  if (name.starts_with("cuda:")) {
    const std::string ord(name.substr(5));
    char* end = nullptr;
    const long v = std::strtol(ord.c_str(), &end, 10);
    SSHSDP_CHECK(!ord.empty() && *end == '\0' && v >= 0 && v < 1024, ConfigError,
                 "backend '{}': the device ordinal must be a number >= 0, e.g. cuda:0", name);
    return MakeCudaBackend(static_cast<int>(v));
  }
  throw ConfigError(fmt::format("unknown backend '{}': use cpu, cuda or cuda:<ordinal>", name));
}

}  // namespace sshsdp
