// MoE kernels (moe_kernels.h): routing, its backward, and the permutation gathers. Plain loops
// over host arrays; the order of every sum is part of the contract (the CPU backend and the
// reference MoE GPT must agree bit for bit, and the CUDA kernels, built with --fmad=false, with
// them): built with -ffp-contract=off, so no compiler fuses a multiply-add on any target.
#include "sshsdp/kernels/moe_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "sshsdp/kernels/elementwise.h"

namespace sshsdp::kernels {
namespace {

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

int64_t MoeChunkRows(int64_t rows) {
  int64_t p = 1;
  while (p * 2 <= rows) p *= 2;
  return p >= 2 && p / 2 * 3 <= rows ? p / 2 * 3 : p;
}

void MoeTopK(float* score, int64_t N, int E, int k, const MoeRouterOptions& opt, int32_t* sel_all,
             float* gate_all) {
  std::vector<char> taken(E);
  for (int64_t t = 0; t < N; ++t) {
    float* z = score + t * E;
    int32_t* sel = sel_all + t * k;
    std::fill(taken.begin(), taken.end(), 0);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (!taken[e] && (best < 0 || z[e] > z[best])) best = e;
      }
      taken[best] = 1;
      sel[j] = best;
    }
    // Scores in place of the logits.
    if (opt.softmax) {
      const float mx = *std::max_element(z, z + E);
      double sum = 0.0;
      for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(z[e] - mx));
      for (int e = 0; e < E; ++e) z[e] = static_cast<float>(std::exp(z[e] - mx) / sum);
    } else {
      for (int e = 0; e < E; ++e) z[e] = 1.0f / (1.0f + std::exp(-z[e]));
    }
    float* gate = gate_all + t * k;
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += z[sel[j]];
    for (int j = 0; j < k; ++j) gate[j] = opt.renormalize ? z[sel[j]] / s : z[sel[j]];
  }
}

void MoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                    const MoeRouterOptions& opt, int32_t* count, double* psum) {
  std::fill_n(count, E, 0);
  std::fill_n(psum, E, 0.0);
  for (int64_t t = 0; t < N; ++t) {
    const float* z = score + t * E;
    for (int j = 0; j < k; ++j) count[sel[t * k + j]]++;
    double qsum = 1.0;
    if (!opt.softmax) {
      qsum = 0.0;
      for (int e = 0; e < E; ++e) qsum += z[e];
    }
    for (int e = 0; e < E; ++e) psum[e] += z[e] / qsum;
  }
}

double MoeBalance(const int32_t* count, const double* psum, int64_t N, int E, int k,
                  float aux_weight, float* frac, int32_t* offsets) {
  double aux = 0.0;
  for (int e = 0; e < E; ++e) {
    frac[e] = static_cast<float>(static_cast<double>(count[e]) / static_cast<double>(N * k));
    aux += static_cast<double>(frac[e]) * (psum[e] / static_cast<double>(N));
  }
  offsets[0] = 0;
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + count[e];
  return static_cast<double>(aux_weight) * E * aux;
}

void MoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k, int32_t* row,
                int32_t* token) {
  std::vector<int32_t> cursor(offsets, offsets + E);
  for (int64_t t = 0; t < N; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t p = cursor[sel[t * k + j]]++;
      row[t * k + j] = p;
      token[p] = static_cast<int32_t>(t);
    }
  }
}

void MoeRouterBackward(const float* score, const int32_t* sel_all, const float* gate_all,
                       const float* frac, const float* dgate, int64_t N, int E, int k,
                       const MoeRouterOptions& opt, float* dz_all) {
  std::vector<double> c_aux(E);  // ∂aux/∂q_{t,e}, the same for every token
  for (int e = 0; e < E; ++e) c_aux[e] = opt.aux_weight * E * frac[e] / static_cast<double>(N);
  std::vector<double> ds(E);
  for (int64_t t = 0; t < N; ++t) {
    const float* s = score + t * E;
    const int32_t* sel = sel_all + t * k;
    const float* gate = gate_all + t * k;
    const float* dg = dgate + t * k;
    std::fill(ds.begin(), ds.end(), 0.0);
    if (opt.renormalize) {
      // gate_j = a_j / S  ⇒  ∂/∂a_i = (dg_i − Σ_j dg_j·gate_j) / S.
      double S = 0.0, dot = 0.0;
      for (int j = 0; j < k; ++j) S += s[sel[j]], dot += static_cast<double>(dg[j]) * gate[j];
      for (int j = 0; j < k; ++j) ds[sel[j]] += (dg[j] - dot) / S;
    } else {
      for (int j = 0; j < k; ++j) ds[sel[j]] += dg[j];
    }
    float* dz = dz_all + t * E;
    if (opt.softmax) {
      // q = p: dz = p ⊙ (ds − Σ p·ds).
      double pds = 0.0;
      for (int e = 0; e < E; ++e) ds[e] += c_aux[e], pds += s[e] * ds[e];
      for (int e = 0; e < E; ++e) dz[e] = static_cast<float>(s[e] * (ds[e] - pds));
    } else {
      // q = σ/Σσ: ∂/∂σ_i += (c_i − Σ_e c_e·q_e) / Σσ; dz = ds · σ(1 − σ).
      double ssum = 0.0, cq = 0.0;
      for (int e = 0; e < E; ++e) ssum += s[e];
      for (int e = 0; e < E; ++e) cq += c_aux[e] * s[e] / ssum;
      for (int e = 0; e < E; ++e) {
        ds[e] += (c_aux[e] - cq) / ssum;
        dz[e] = static_cast<float>(ds[e] * s[e] * (1.0f - s[e]));
      }
    }
  }
}

void MoeGatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) std::copy_n(src + int64_t{idx[r]} * d, d, dst + r * d);
}

void MoeCombine(const float* yp, const int32_t* row, const float* gate, float* out, int64_t N,
                int k, int64_t d, bool accumulate) {
  if (!accumulate) Fill(out, N * d, 0.0f);
  for (int64_t t = 0; t < N; ++t) {
    float* o = out + t * d;
    for (int j = 0; j < k; ++j) {
      const float g = gate[t * k + j];
      const float* y = yp + static_cast<int64_t>(row[t * k + j]) * d;
      for (int64_t i = 0; i < d; ++i) o[i] += g * y[i];  // no FMA: -ffp-contract=off
    }
  }
}

void MoeCombineBackward(const float* dy, const float* yp, const int32_t* row, const float* gate,
                        float* dgate, float* dyp, int64_t N, int k, int64_t d) {
  for (int64_t t = 0; t < N; ++t) {
    const float* dyt = dy + t * d;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      dgate[t * k + j] = Dot(dyt, yp + r * d, d);
      const float g = gate[t * k + j];
      float* dst = dyp + r * d;
      for (int64_t i = 0; i < d; ++i) dst[i] = g * dyt[i];
    }
  }
}

void MoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k, int64_t d) {
  for (int64_t t = 0; t < N; ++t) {
    float* dxt = dx + t * d;
    std::copy_n(dxp + static_cast<int64_t>(row[t * k]) * d, d, dxt);
    for (int j = 1; j < k; ++j) Add(dxt, dxp + static_cast<int64_t>(row[t * k + j]) * d, dxt, d);
  }
}

}  // namespace sshsdp::kernels
