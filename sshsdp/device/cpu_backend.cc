// The CPU backend (backend.h): host memory and the functions the engine runs today — the
// reference every other backend is checked against. Also the backend factory, which needs
// no CUDA: MakeCudaBackend is defined by cuda_backend.cc, or by no_cuda.cc without CUDA.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "sshsdp/device/backend.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  void* Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::malloc(bytes);
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
  void Synchronize() override {}

  void Fill(float* x, int64_t n, float value) override {
    CheckCount(n, "Fill");
    kernels::Fill(x, n, value);
  }
  void CastF32ToBf16(const float* x, bf16* y, int64_t n) override {
    CheckCount(n, "CastF32ToBf16");
    FloatToBf16(x, y, static_cast<size_t>(n));
  }
  void CastBf16ToF32(const bf16* x, float* y, int64_t n) override {
    CheckCount(n, "CastBf16ToF32");
    Bf16ToFloat(x, y, static_cast<size_t>(n));
  }
  void StochasticRoundBf16(const float* x, bf16* y, int64_t n, const SrKey& key,
                           uint64_t first_index) override {
    CheckCount(n, "StochasticRoundBf16");
    sshsdp::StochasticRoundBf16(x, y, static_cast<size_t>(n), key, first_index);
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
  void MxDequantizeWeight(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                          float* out, const MxOptions& opt) override {
    sshsdp::MxDequantizeWeight(q, scales, rows, cols, out, opt);
  }
  double SumSquares(const float* x, int64_t n) override {
    CheckCount(n, "SumSquares");
    return kernels::SumSquares(x, n);
  }
  void NewtonSchulz(const float* const* in, float* const* out, int64_t batch, int64_t rows,
                    int64_t cols, int steps, const NsCoefficients& coef, float out_scale) override {
    std::vector<const void*> src(in, in + batch);
    ns_.Run(src.data(), DType::kF32, out, batch, rows, cols, steps, coef, out_scale);
  }

 private:
  sshsdp::NewtonSchulz ns_;
};

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
