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
  // Each table: scatter-add rows into fp32 (the view itself when it is fp32; a scratch table
  // when bf16, written once at the end so bf16 rounding happens once per element).
  auto scatter = [&](const TensorRef& g, int64_t rows, auto&& row_of) {
    const int64_t n = rows * d;
    float* dst;
    bool direct = g.dtype == DType::kF32;
    if (direct) {
      dst = static_cast<float*>(g.data);
      if (!accumulate) kernels::Fill(dst, n, 0.0f);  // rows that never occur get explicit zeros
    } else {
      if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(n);
      dst = scratch.data();
      kernels::Fill(dst, n, 0.0f);
    }
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const float* g_row = dx + (static_cast<int64_t>(b) * T + t) * d;
        float* row = dst + row_of(b, t) * d;
        for (int i = 0; i < d; ++i) row[i] += g_row[i];  // repeated tokens add up
      }
    }
    if (!direct) kernels::WriteOrAccumulate(dst, g.data, g.dtype, n, accumulate);
  };
  scatter(dwte, vocab, [&](int b, int t) {
    return static_cast<int64_t>(tokens[static_cast<int64_t>(b) * T + t]);
  });
  scatter(dwpe, seq_len, [](int, int t) { return static_cast<int64_t>(t); });
}

RuntimeParamSpec Single(std::string name, std::vector<int64_t> shape, UpdateKind kind,
                        InitSpec init) {
  RuntimeParamSpec s{name, shape, {}};
  s.parts.push_back(UpdatePart{std::move(name), std::move(shape), 0, kind, init});
  return s;
}

}  // namespace sshsdp::layers
