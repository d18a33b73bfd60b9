// Shared layer code of the reference models that reads runtime-parameter views (see
// layers.h): row loads from fp32/bf16 tables, the embeddings, spec helpers. The fp32 layer
// kernels (RMSNorm, GELU, SwiGLU, cross-entropy) are kernels/layer_kernels.cc.
#include "sshsdp/models/layers.h"

#include <algorithm>

#include "sshsdp/kernels/elementwise.h"

namespace sshsdp::layers {

// Row `row` of a [rows, d] fp32/bf16 table as fp32.
void LoadRow(const TensorRef& t, int64_t row, int d, float* out) {
  if (t.dtype == DType::kF32) {
    std::copy_n(static_cast<const float*>(t.data) + row * d, d, out);
  } else {
    Bf16ToFloat(static_cast<const bf16*>(t.data) + row * d, out, static_cast<size_t>(d));
  }
}

void EmbeddingForward(const TensorRef& wte, const TensorRef& wpe, const int32_t* tokens, int B,
                      int T, int d, float* out) {
  std::vector<float> pos(d);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* x = out + (static_cast<int64_t>(b) * T + t) * d;
      LoadRow(wte, tokens[static_cast<int64_t>(b) * T + t], d, x);
      LoadRow(wpe, t, d, pos.data());
      for (int i = 0; i < d; ++i) x[i] += pos[i];
    }
  }
}

void EmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d,
                       const TensorRef& dwte, int64_t vocab, const TensorRef& dwpe, int64_t seq_len,
                       bool accumulate, std::vector<float>& scratch) {
  // The scatter-add is kernels::EmbeddingBackwardF32's, into fp32 tables: a view itself when
  // it is fp32 (zeroed first unless accumulating, so rows that never occur get explicit
  // zeros), else a zeroed scratch table written once at the end, so bf16 rounding happens
  // once per element.
  const int64_t n_te = vocab * d, n_pe = seq_len * d;
  const bool te_direct = dwte.dtype == DType::kF32, pe_direct = dwpe.dtype == DType::kF32;
  const int64_t need = (te_direct ? 0 : n_te) + (pe_direct ? 0 : n_pe);
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(static_cast<size_t>(need));
  float* te = te_direct ? static_cast<float*>(dwte.data) : scratch.data();
  float* pe = pe_direct ? static_cast<float*>(dwpe.data) : scratch.data() + (te_direct ? 0 : n_te);
  if (!te_direct || !accumulate) kernels::Fill(te, n_te, 0.0f);
  if (!pe_direct || !accumulate) kernels::Fill(pe, n_pe, 0.0f);
  kernels::EmbeddingBackwardF32(dx, tokens, B, T, d, te, vocab, pe, seq_len, /*accumulate=*/true);
  if (!te_direct) kernels::WriteOrAccumulate(te, dwte.data, dwte.dtype, n_te, accumulate);
  if (!pe_direct) kernels::WriteOrAccumulate(pe, dwpe.data, dwpe.dtype, n_pe, accumulate);
}

RuntimeParamSpec Single(std::string name, std::vector<int64_t> shape, UpdateKind kind,
                        InitSpec init) {
  RuntimeParamSpec s{name, shape, {}};
  s.parts.push_back(UpdatePart{std::move(name), std::move(shape), 0, kind, init});
  return s;
}

}  // namespace sshsdp::layers
