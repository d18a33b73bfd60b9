// The CUDA backend's kernels (cuda_kernels_internal.h): elementwise ops with one thread per
// element (grid-stride), stochastic rounding with one thread per Philox block of 8 elements,
// MXFP8 weight (de)quantization per 32x32 tile, a two-pass double reduction whose grid depends
// only on n, the Newton–Schulz elementwise pieces, and the reference GPT's
// layer kernels (row-per-block reductions; plain embedding-gradient kernels, deterministic, not
// fast; attention is cuda_attention_kernels.cu's). Compiled with --fmad=false (no multiply-add
// contraction): the elementwise ops apply the CPU code's fp32 operations in its order; the
// reductions sum in tree order, not the CPU's. The optimizers' elementwise kernels are in
// cuda_update_kernels.cu.
#include <algorithm>

#include "sshsdp/backend/cuda_common.cuh"
#include "sshsdp/backend/cuda_kernels_internal.h"

namespace sshsdp::cuda {
namespace {

// ---- Kernels. ----
__global__ void FillKernel(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = value;
}

__global__ void CastF32ToBf16Kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = FloatToBf16Bits(x[i]);
}

__global__ void CastBf16ToF32Kernel(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

// Tree sum of a block's double values in shared memory; every thread gets the total. Assumes
// blockDim.x == kThreads and one call per kernel (a second would race on `buf`).
__device__ double BlockSum(double s) {
  __shared__ double buf[kThreads];
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
    __syncthreads();
  }
  return buf[0];
}

// Pass 1: partial[block] = Σ x² over the block's grid-stride elements.
__global__ void SumSquaresPartial(const float* x, int64_t n, double* partial) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  const double t = BlockSum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = t;
}

// Pass 2 (one block): out = Σ partial.
__global__ void SumPartials(const double* partial, int count, double* out) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  const double t = BlockSum(s);
  if (threadIdx.x == 0) *out = t;
}

// One block per matrix: x_b *= 1 / (‖x_b‖_F + 1e-7) (the Newton–Schulz normalisation).
__global__ void NormalizeMatrices(float* x, int64_t per) {
  float* xb = x + blockIdx.x * per;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < per; i += blockDim.x) s += static_cast<double>(xb[i]) * xb[i];
  const double total = BlockSum(s);
  const float scale = static_cast<float>(1.0 / (sqrt(total) + 1e-7));
  for (int64_t i = threadIdx.x; i < per; i += blockDim.x) xb[i] *= scale;
}

// B = b·A + c·B, then a added on the diagonal of every m×m matrix.
__global__ void NsPolynomial(const float* A, float* B, int64_t total, int64_t m, float a, float b,
                             float c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = b * A[i] + c * B[i];
    const int64_t k = i % (m * m);
    if (k / m == k % m) v += a;
    B[i] = v;
  }
}

// out[b][i] = scale · x_b[i] for every matrix b (out: a device array of pointers).
__global__ void ScaleOut(const float* x, float* const* out, int64_t per, float scale) {
  const float* xb = x + blockIdx.y * per;
  float* o = out[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < per;
       i += int64_t{gridDim.x} * blockDim.x)
    o[i] = scale * xb[i];
}

// ---- MXFP8 weight quantization (numerics/mx.h): 32x32 blocks, UE8M0 scales. ----
// MxScaleCode: the block's scale code from its amax bits; elem_emax 8 (E4M3) or 15 (E5M2),
// ceil = the kCeil rule (else the OCP floor rule).
__device__ uint8_t MxScaleCodeDevice(uint32_t a, int elem_emax, bool ceil) {
  if (a >= 0x7F800000u) return 0xFF;  // NaN or Inf in the block
  if (a == 0) return 0;
  int exp;
  uint32_t mant;
  if ((a >> 23) == 0) {
    const int top = 31 - __clz(a);
    exp = -149 + top;
    mant = (a << (23 - top)) & 0x7FFFFFu;
  } else {
    exp = static_cast<int>(a >> 23) - 127;
    mant = a & 0x7FFFFFu;
  }
  int e = exp - elem_emax;
  if (ceil && mant > 0x600000u) ++e;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return static_cast<uint8_t>(e + 127);
}

// fp8_internal::EncodeSatFinite<mbits, bias, max_code> for finite f.
template <int kMbits, int kBias, uint32_t kMaxCode>
__device__ __forceinline__ uint8_t EncodeSatFiniteDevice(float f) {
  constexpr int kShift = 23 - kMbits;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - kBias) << 23;
  constexpr uint32_t kMagicBits = static_cast<uint32_t>(24 - kBias - kMbits + 127) << 23;
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t normal = (a + ((1u << (kShift - 1)) - 1) + ((a >> kShift) & 1u)) >> kShift;
  normal -= static_cast<uint32_t>(127 - kBias) << kMbits;
  const uint32_t sub =
      __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(kMagicBits))) - kMagicBits;
  uint32_t code = a < kMinNormalBits ? sub : normal;
  code = code < kMaxCode ? code : kMaxCode;
  return static_cast<uint8_t>(code | sign);
}

// One 256-thread block per 32x32 weight block (grid x = column blocks, y = row blocks).
template <bool kE4M3>
__global__ void MxQuantizeWeightKernel(const float* w, int64_t rows, int64_t cols, uint8_t* q,
                                       uint8_t* scales, bool ceil) {
  __shared__ uint32_t amax;
  __shared__ uint8_t code;
  const int64_t r0 = int64_t{blockIdx.y} * 32, c0 = int64_t{blockIdx.x} * 32;
  const int64_t nr = rows - r0 < 32 ? rows - r0 : 32, nc = cols - c0 < 32 ? cols - c0 : 32;
  if (threadIdx.x == 0) amax = 0;
  __syncthreads();
  uint32_t local = 0;
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) {
    const int64_t r = i / 32, c = i % 32;
    if (r < nr && c < nc) {
      const uint32_t a = __float_as_uint(w[(r0 + r) * cols + c0 + c]) & 0x7FFFFFFFu;
      local = a > local ? a : local;
    }
  }
  atomicMax(&amax, local);
  __syncthreads();
  if (threadIdx.x == 0) {
    code = MxScaleCodeDevice(amax, kE4M3 ? 8 : 15, ceil);
    scales[int64_t{blockIdx.y} * gridDim.x + blockIdx.x] = code;
  }
  __syncthreads();
  const uint8_t nan_code = kE4M3 ? 0x7F : 0x7E;
  // 2^-e = UE8M0 code 254 - code: exact (2^-127 is the fp32 subnormal 0x00400000).
  const uint8_t ic = static_cast<uint8_t>(254 - code);
  const float inv = __uint_as_float(ic == 0 ? 0x00400000u : static_cast<uint32_t>(ic) << 23);
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) {
    const int64_t r = i / 32, c = i % 32;
    if (r >= nr || c >= nc) continue;
    const int64_t at = (r0 + r) * cols + c0 + c;
    if (code == 0xFF) {
      q[at] = nan_code;
    } else {
      const float x = __fmul_rn(w[at], inv);
      q[at] = kE4M3 ? EncodeSatFiniteDevice<3, 7, 0x7E>(x) : EncodeSatFiniteDevice<2, 15, 0x7B>(x);
    }
  }
}

// fp8.h's decode tables, from the bits: E4M3 (bias 7, no Inf, S.1111.111 NaN) and E5M2
// (bias 15, IEEE Inf/NaN); every value is exact in fp32.
__device__ float DecodeFp8(uint8_t c, bool e4m3) {
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax_field = e4m3 ? 15 : 31;
  const uint32_t sign = static_cast<uint32_t>(c >> 7) << 31;
  const uint32_t e = (c >> mbits) & emax_field, m = c & ((1u << mbits) - 1);
  uint32_t bits;
  if (!e4m3 && e == static_cast<uint32_t>(emax_field)) {
    bits = m == 0 ? 0x7F800000u : 0x7FC00000u;
  } else if (e4m3 && e == 15u && m == 7u) {
    bits = 0x7FC00000u;
  } else if (e == 0) {
    if (m == 0) {
      bits = 0;
    } else {
      const int top = 31 - __clz(m);
      const int exp = 1 - bias - mbits + top;
      bits = (static_cast<uint32_t>(exp + 127) << 23) | ((m & ~(1u << top)) << (23 - top));
    }
  } else {
    bits = (static_cast<uint32_t>(static_cast<int>(e) - bias + 127) << 23) | (m << (23 - mbits));
  }
  return __uint_as_float(bits | sign);
}

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(uint16_t* p, float v) { *p = FloatToBf16Bits(v); }

// Out: float, or uint16_t for bf16 bits (round to nearest even).
template <typename Out>
__global__ void MxDequantizeKernel(const uint8_t* q, const uint8_t* scales, int64_t rows,
                                   int64_t cols, int block_rows, Out* out, bool e4m3) {
  const int64_t kb = (cols + 31) / 32, n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const uint8_t sc = scales[(r / block_rows) * kb + c / 32];
    const float s = sc == 0xFF ? __uint_as_float(0x7FC00000u)
                               : __uint_as_float(sc == 0 ? 0x00400000u : uint32_t{sc} << 23);
    Store(out + i, __fmul_rn(DecodeFp8(q[i], e4m3), s));
  }
}

// ---- The reference GPT's layer kernels (kernels/layer_kernels.cc). ----
struct AddOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return a > b ? a : b; }
};

// Tree reduction of one value per thread over the block (blockDim.x == kThreads) in the
// caller's shared buffer; every thread gets the result, and buf may be reused afterwards.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* buf, Op op) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) buf[threadIdx.x] = op(buf[threadIdx.x], buf[threadIdx.x + w]);
    __syncthreads();
  }
  const T r = buf[0];
  __syncthreads();
  return r;
}

// One block per row: rstd = 1/sqrt(mean(x²) + eps), y = x·rstd·g.
__global__ void RmsNormForwardKernel(const float* x, const float* g, float* y, float* rstd, int d,
                                     float eps) {
  __shared__ float buf[kThreads];
  const float* xr = x + blockIdx.x * int64_t{d};
  float* yr = y + blockIdx.x * int64_t{d};
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockReduce(ss, buf, AddOp{});
  const float s = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * s * g[i];
}

// One block per row: dx (+)= rstd·(g·dy − x·rstd²·Σ(dy·g·x)/d).
__global__ void RmsNormBackwardRowsKernel(const float* dy, const float* x, const float* g,
                                          const float* rstd, float* dx, int d, bool accumulate) {
  __shared__ float buf[kThreads];
  const int64_t off = blockIdx.x * int64_t{d};
  const float s = rstd[blockIdx.x];
  float dot = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) dot += dy[off + i] * g[i] * x[off + i];
  dot = BlockReduce(dot, buf, AddOp{});
  const float c = s * s * dot / static_cast<float>(d);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = s * (g[i] * dy[off + i] - x[off + i] * c);
    dx[off + i] = accumulate ? dx[off + i] + v : v;
  }
}

// One thread per column: dg = Σ_rows dy·x·rstd, rows in order (the CPU's order).
__global__ void RmsNormGainKernel(const float* dy, const float* x, const float* rstd, float* dg,
                                  int64_t rows, int d) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= d) return;
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += dy[r * d + i] * x[r * d + i] * rstd[r];
  dg[i] = acc;
}

__device__ __forceinline__ float GeluTanh(float v, float c) {
  float z = c * (v + 0.044715f * v * v * v);
  z = fminf(fmaxf(z, -10.0f), 10.0f);
  return 1.0f - 2.0f / (expf(2.0f * z) + 1.0f);
}

__global__ void GeluForwardKernel(const float* x, float* y, int64_t n, float c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + GeluTanh(v, c));
  }
}

__global__ void GeluBackwardKernel(const float* x, float* dy, int64_t n, float c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float t = GeluTanh(v, c);
    const float dt = (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * v * v);
    dy[i] *= 0.5f * (1.0f + t) + 0.5f * v * dt;
  }
}

__global__ void SwigluForwardKernel(const float* h1, const float* h3, float* a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float z = h1[i];
    const float s = 1.0f / (1.0f + expf(-z));
    a[i] = z * s * h3[i];
  }
}

// da may alias dh1 or dh3: each element is read before either output is written.
__global__ void SwigluBackwardKernel(const float* h1, const float* h3, const float* da, float* dh1,
                                     float* dh3, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float z = h1[i], g = da[i], h = h3[i];
    const float s = 1.0f / (1.0f + expf(-z));
    dh1[i] = g * h * s * (1.0f + z * (1.0f - s));
    dh3[i] = g * z * s;
  }
}

// One block per row of [rows, ld] logits, the first V real: probabilities in place (padded
// columns 0), losses[r] = lse − logit[target] (lse in double), row_loss[r] the same in double.
__global__ void SoftmaxCrossEntropyKernel(float* logits, const int32_t* targets, float* losses,
                                          double* row_loss, int64_t V, int64_t ld) {
  __shared__ float buf[kThreads];
  float* p = logits + blockIdx.x * ld;
  const float target_logit = p[targets[blockIdx.x]];
  float mx = p[0];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = p[v] > mx ? p[v] : mx;
  mx = BlockReduce(mx, buf, MaxOp{});
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float e = expf(p[v] - mx);
    p[v] = e;
    sum += e;
  }
  for (int64_t v = V + threadIdx.x; v < ld; v += blockDim.x) p[v] = 0.0f;
  sum = BlockReduce(sum, buf, AddOp{});
  if (threadIdx.x == 0) {
    const double loss = static_cast<double>(mx) + log(static_cast<double>(sum)) - target_logit;
    losses[blockIdx.x] = static_cast<float>(loss);
    row_loss[blockIdx.x] = loss;
  }
  const float inv = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] *= inv;
}

// One block: out = Σ x[i] over n doubles.
__global__ void SumDoubles(const double* x, int64_t n, double* out) {
  __shared__ double buf[kThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = BlockReduce(s, buf, AddOp{});
  if (threadIdx.x == 0) *out = s;
}

__global__ void ScaleCopyKernel(const float* x, float* y, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = x[i] * scale;
}

__global__ void SubtractAtTargets(float* dl, const int32_t* targets, int64_t rows, int64_t ld,
                                  float scale) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x)
    dl[r * ld + targets[r]] -= scale;
}

// ---- Embeddings (fp32 tables), residual add. ----
__global__ void EmbeddingForwardKernel(const float* wte, const float* wpe, const int32_t* tokens,
                                       int64_t BT, int T, int d, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < BT * d;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / d, c = i % d;
    const float e = wte[int64_t{tokens[bt]} * d + c];
    out[i] = wpe ? e + wpe[(bt % T) * d + c] : e;
  }
}

// One thread per column of the token table: rows added in (sample, position) order, as the
// CPU adds them (a deterministic reference kernel; a fast one would sort by token first).
__global__ void EmbeddingTokenGradKernel(const float* dx, const int32_t* tokens, int64_t BT, int d,
                                         float* dwte) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  for (int64_t bt = 0; bt < BT; ++bt) dwte[int64_t{tokens[bt]} * d + c] += dx[bt * d + c];
}

// One thread per (position, column): samples in order.
__global__ void EmbeddingPositionGradKernel(const float* dx, int B, int T, int d, float* dwpe) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < int64_t{T} * d;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dx[int64_t{b} * T * d + i];
    dwpe[i] = acc;
  }
}

__global__ void AddKernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = a[i] + b[i];
}

}  // namespace

cudaError_t LaunchFill(float* x, int64_t n, float value, cudaStream_t s) {
  SSHSDP_LAUNCH(FillKernel, GridFor(n), kThreads, 0, s)(x, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchCastF32ToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t s) {
  SSHSDP_LAUNCH(CastF32ToBf16Kernel, GridFor(n), kThreads, 0, s)(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchCastBf16ToF32(const uint16_t* x, float* y, int64_t n, cudaStream_t s) {
  SSHSDP_LAUNCH(CastBf16ToF32Kernel, GridFor(n), kThreads, 0, s)(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchSumSquares(const float* x, int64_t n, double* partial, cudaStream_t s) {
  const int grid = std::min(GridFor(n), kSumSquaresPartials);
  SSHSDP_LAUNCH(SumSquaresPartial, grid, kThreads, 0, s)(x, n, partial);
  SSHSDP_LAUNCH(SumPartials, 1, kThreads, 0, s)(partial, grid, partial + kSumSquaresPartials);
  return cudaGetLastError();
}

cudaError_t LaunchNormalizeMatrices(float* x, int64_t per, int64_t batch, cudaStream_t s) {
  SSHSDP_LAUNCH(NormalizeMatrices, static_cast<unsigned>(batch), kThreads, 0, s)(x, per);
  return cudaGetLastError();
}

cudaError_t LaunchNsPolynomial(const float* A, float* B, int64_t total, int64_t m, float a, float b,
                               float c, cudaStream_t s) {
  SSHSDP_LAUNCH(NsPolynomial, GridFor(total), kThreads, 0, s)(A, B, total, m, a, b, c);
  return cudaGetLastError();
}

cudaError_t LaunchScaleOut(const float* x, float* const* out, int64_t per, int64_t batch,
                           float scale, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(std::min(GridFor(per), 64)), static_cast<unsigned>(batch));
  SSHSDP_LAUNCH(ScaleOut, grid, kThreads, 0, s)(x, out, per, scale);
  return cudaGetLastError();
}

cudaError_t LaunchMxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q,
                                   uint8_t* scales, bool e4m3, bool ceil, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  if (e4m3) SSHSDP_LAUNCH(MxQuantizeWeightKernel<true>, grid, kThreads, 0, s)
  (w, rows, cols, q, scales, ceil);
  else SSHSDP_LAUNCH(MxQuantizeWeightKernel<false>, grid, kThreads, 0, s)(w, rows, cols, q, scales,
                                                                          ceil);
  return cudaGetLastError();
}

cudaError_t LaunchMxDequantize(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                               int block_rows, float* out, bool e4m3, cudaStream_t s) {
  SSHSDP_LAUNCH(MxDequantizeKernel, GridFor(rows * cols), kThreads, 0, s)
  (q, scales, rows, cols, block_rows, out, e4m3);
  return cudaGetLastError();
}

cudaError_t LaunchMxDequantizeBf16(const uint8_t* q, const uint8_t* scales, int64_t rows,
                                   int64_t cols, int block_rows, uint16_t* out, bool e4m3,
                                   cudaStream_t s) {
  SSHSDP_LAUNCH(MxDequantizeKernel, GridFor(rows * cols), kThreads, 0, s)
  (q, scales, rows, cols, block_rows, out, e4m3);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormForward(const float* x, const float* g, float* y, float* rstd,
                                 int64_t rows, int d, float eps, cudaStream_t s) {
  SSHSDP_LAUNCH(RmsNormForwardKernel, static_cast<unsigned>(rows), kThreads, 0, s)
  (x, g, y, rstd, d, eps);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormBackward(const float* dy, const float* x, const float* g,
                                  const float* rstd, float* dx, float* dg, int64_t rows, int d,
                                  bool accumulate_dx, cudaStream_t s) {
  SSHSDP_LAUNCH(RmsNormBackwardRowsKernel, static_cast<unsigned>(rows), kThreads, 0, s)
  (dy, x, g, rstd, dx, d, accumulate_dx);
  SSHSDP_LAUNCH(RmsNormGainKernel, (d + kThreads - 1) / kThreads, kThreads, 0, s)
  (dy, x, rstd, dg, rows, d);
  return cudaGetLastError();
}

cudaError_t LaunchGeluForward(const float* x, float* y, int64_t n, float c, cudaStream_t s) {
  SSHSDP_LAUNCH(GeluForwardKernel, GridFor(n), kThreads, 0, s)(x, y, n, c);
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(const float* x, float* dy, int64_t n, float c, cudaStream_t s) {
  SSHSDP_LAUNCH(GeluBackwardKernel, GridFor(n), kThreads, 0, s)(x, dy, n, c);
  return cudaGetLastError();
}

cudaError_t LaunchSwigluForward(const float* h1, const float* h3, float* a, int64_t n,
                                cudaStream_t s) {
  SSHSDP_LAUNCH(SwigluForwardKernel, GridFor(n), kThreads, 0, s)(h1, h3, a, n);
  return cudaGetLastError();
}

cudaError_t LaunchSwigluBackward(const float* h1, const float* h3, const float* da, float* dh1,
                                 float* dh3, int64_t n, cudaStream_t s) {
  SSHSDP_LAUNCH(SwigluBackwardKernel, GridFor(n), kThreads, 0, s)(h1, h3, da, dh1, dh3, n);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(float* logits, const int32_t* targets, float* losses,
                                      double* row_loss, int64_t rows, int64_t V, int64_t ld,
                                      double* total, cudaStream_t s) {
  SSHSDP_LAUNCH(SoftmaxCrossEntropyKernel, static_cast<unsigned>(rows), kThreads, 0, s)
  (logits, targets, losses, row_loss, V, ld);
  SSHSDP_LAUNCH(SumDoubles, 1, kThreads, 0, s)(row_loss, rows, total);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets,
                                              float* dlogits, int64_t rows, int64_t ld, float scale,
                                              cudaStream_t s) {
  SSHSDP_LAUNCH(ScaleCopyKernel, GridFor(rows * ld), kThreads, 0, s)
  (probs, dlogits, rows * ld, scale);
  SSHSDP_LAUNCH(SubtractAtTargets, GridFor(rows), kThreads, 0, s)
  (dlogits, targets, rows, ld, scale);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingForward(const float* wte, const float* wpe, const int32_t* tokens, int B,
                                   int T, int d, float* out, cudaStream_t s) {
  const int64_t BT = int64_t{B} * T;
  SSHSDP_LAUNCH(EmbeddingForwardKernel, GridFor(BT * d), kThreads, 0, s)
  (wte, wpe, tokens, BT, T, d, out);
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d,
                                    float* dwte, float* dwpe, cudaStream_t s) {
  SSHSDP_LAUNCH(EmbeddingTokenGradKernel, (d + kThreads - 1) / kThreads, kThreads, 0, s)
  (dx, tokens, int64_t{B} * T, d, dwte);
  if (dwpe == nullptr) return cudaGetLastError();  // no position table
  SSHSDP_LAUNCH(EmbeddingPositionGradKernel, GridFor(int64_t{T} * d), kThreads, 0, s)
  (dx, B, T, d, dwpe);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  SSHSDP_LAUNCH(AddKernel, GridFor(n), kThreads, 0, s)(a, b, y, n);
  return cudaGetLastError();
}

}  // namespace sshsdp::cuda
