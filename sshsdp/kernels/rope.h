// The attention input of the Llama-family models (models/llama.h), between the packed QKV
// projection and the causal attention: per-head QK-RMSNorm (Qwen3), rotary position
// embeddings (RoPE, Hugging Face's non-interleaved `rotate_half` form) and grouped-query
// attention's sharing of K/V heads, as one forward / backward pair.
//
// The projection writes raw [B·T, (Hq + 2·Hkv)·dh] (per row: every Q head, then every K head,
// then every V head, dh each); attention (kernels/attention.h) reads the packed layout
// [B·T, 3·Hq·dh] with as many K and V heads as Q heads. Forward writes that layout: Q head h
// normalised and rotated, K head h / G (G = Hq / Hkv, transformers' repeat_kv) normalised and
// rotated, V head h / G as it is. Backward sums the G copies of each K / V head's gradient.
//
// RoPE at position t = row % T, frequency i < dh/2: cos/sin tables [T, dh/2] (RopeTables),
//   y[i]        = x[i]·cos − x[i + dh/2]·sin
//   y[i + dh/2] = x[i + dh/2]·cos + x[i]·sin
// QK-norm (gains non-null): x ← x·rstd·g over each head's dh values, rstd = 1/sqrt(mean(x²) +
// eps) (kernels/layer_kernels.h's RMSNorm), before RoPE. Rows go to kernel threads; the gains'
// gradients are summed per column over rows and heads in order: the same bits at any thread
// count.
//
//   RopeShape s{B, T, Hq, Hkv, dh};
//   RopeTables tab = MakeRopeTables(seq_len, dh, 1e6);
//   RopeQkvForward(raw, tab.cos.data(), tab.sin.data(), qg, kg, 1e-6f, att, rstd, s);
//   RopeQkvBackward(datt, raw, cos, sin, qg, kg, rstd, draw, dqg, dkg, s);
#pragma once

#include <cstdint>
#include <vector>

namespace sshsdp::kernels {

struct RopeShape {
  int B = 0, T = 0;
  int Hq = 0, Hkv = 0;  // Hkv divides Hq
  int dh = 0;           // even
  int64_t rows() const { return int64_t{B} * T; }
  int64_t raw_width() const { return int64_t{Hq + 2 * Hkv} * dh; }
  int64_t att_width() const { return int64_t{3} * Hq * dh; }
  int norm_heads() const { return Hq + Hkv; }  // rstd per row: Q heads, then K heads
};

// cos/sin [positions, dh/2] as transformers computes them in fp32 ("default" RoPE):
// inv_freq[i] = 1 / theta^(2i/dh), angle = t · inv_freq[i].
struct RopeTables {
  std::vector<float> cos, sin;
};
RopeTables MakeRopeTables(int positions, int dh, double theta);

// NumericsError unless the shape is valid (positive sizes, dh even, Hkv | Hq).
void CheckRopeShape(const RopeShape& s, const char* op);

// raw → att as above; rstd [rows, Hq + Hkv] written when the gains are given (both or none).
void RopeQkvForward(const float* raw, const float* cos, const float* sin, const float* q_gain,
                    const float* k_gain, float eps, float* att, float* rstd, const RopeShape& s);
// From datt [rows, 3·Hq·dh]: draw [rows, raw_width] overwritten; with the gains, dq_gain and
// dk_gain [dh] overwritten with their gradients.
void RopeQkvBackward(const float* datt, const float* raw, const float* cos, const float* sin,
                     const float* q_gain, const float* k_gain, const float* rstd, float* draw,
                     float* dq_gain, float* dk_gain, const RopeShape& s);

}  // namespace sshsdp::kernels
