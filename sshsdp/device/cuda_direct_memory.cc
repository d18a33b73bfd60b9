// CudaDirectMemory (cuda_direct_memory.h): CUDA IPC regions, device copies and the slice
// reduction for the direct path, on one non-blocking stream.
#include "sshsdp/device/cuda_direct_memory.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sshsdp/backend/cuda_kernels_internal.h"

namespace sshsdp {
namespace {

void Ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw DeviceError(fmt::format("direct path on CUDA: {} failed: {} ({})", call,
                                  cudaGetErrorName(e), cudaGetErrorString(e)));
}
#define SSHSDP_CUDA_DIRECT_OK(call) Ok((call), #call)

class CudaDirectMemory final : public DirectDeviceMemory {
 public:
  CudaDirectMemory(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {
    SSHSDP_CUDA_DIRECT_OK(cudaSetDevice(ordinal_));
    SSHSDP_CUDA_DIRECT_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaDirectMemory() override {
    cudaSetDevice(ordinal_);
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return name_; }

  std::vector<char*> OpenRegions(size_t bytes, int my_l, int L,
                                 const NodeAllGather& all_gather) override {
    SSHSDP_CUDA_DIRECT_OK(cudaSetDevice(ordinal_));
    std::vector<char*> bases(L, nullptr);
    void* own = nullptr;
    int ok = 1;
    std::string error;
    cudaIpcMemHandle_t mine{};
    // A failure here still takes part in both all-gathers below, so every member throws.
    auto fail = [&](cudaError_t e, const char* call) {
      if (e == cudaSuccess || !ok) return;
      ok = 0;
      error = fmt::format("{}: {}", call, cudaGetErrorName(e));
      cudaGetLastError();
    };
    fail(cudaMalloc(&own, bytes), "cudaMalloc");
    if (ok) fail(cudaMemsetAsync(own, 0, bytes, stream_), "cudaMemsetAsync");
    if (ok) fail(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (ok) fail(cudaIpcGetMemHandle(&mine, own), "cudaIpcGetMemHandle");
    bases[my_l] = static_cast<char*>(own);
    std::vector<cudaIpcMemHandle_t> all(L);
    all_gather(&mine, all.data(), sizeof(mine));
    std::vector<int> first(L);
    all_gather(&ok, first.data(), sizeof(int));
    for (int l = 0; l < L; ++l) {
      if (l == my_l || !first[l] || !ok) continue;
      void* p = nullptr;
      const cudaError_t e = cudaIpcOpenMemHandle(&p, all[l], cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        ok = 0;
        error = fmt::format("cudaIpcOpenMemHandle of node member {}: {}", l, cudaGetErrorName(e));
        cudaGetLastError();
        continue;
      }
      bases[l] = static_cast<char*>(p);
    }
    std::vector<int> oks(L);
    all_gather(&ok, oks.data(), sizeof(int));
    for (int l = 0; l < L; ++l) {
      if (oks[l] && first[l]) continue;
      for (int j = 0; j < L; ++j)
        if (j != my_l && bases[j]) cudaIpcCloseMemHandle(bases[j]);
      if (own) cudaFree(own);
      throw DeviceError(fmt::format(
          "direct path on {}: node member {} could not map the other members' memory{}{}", name_, l,
          error.empty() ? "" : "; here: ", error));
    }
    return bases;
  }

  void CloseRegions(const std::vector<char*>& bases, int my_l,
                    const std::function<void()>& node_barrier) noexcept override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    for (size_t l = 0; l < bases.size(); ++l) {
      if (static_cast<int>(l) == my_l || bases[l] == nullptr) continue;
      if (cudaIpcCloseMemHandle(bases[l]) != cudaSuccess)
        std::fprintf(stderr, "sshsdp: cudaIpcCloseMemHandle failed on %s\n", name_.c_str());
    }
    node_barrier();  // nobody maps this rank's region any more
    if (cudaFree(bases[my_l]) != cudaSuccess)
      std::fprintf(stderr, "sshsdp: cudaFree of a direct-path region failed on %s\n",
                   name_.c_str());
  }

  bool IsDeviceMemory(const void* p, size_t bytes) const override {
    if (bytes == 0) return true;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    SSHSDP_CUDA_DIRECT_OK(cudaSetDevice(ordinal_));
    SSHSDP_CUDA_DIRECT_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  void ReduceSlices(const void* const* srcs, DType src_dtype, int m, void* out, DType out_dtype,
                    size_t n, bool accumulate) override {
    if (n == 0) return;
    SSHSDP_CHECK(m >= 1 && m <= cuda::kMaxSlices, DeviceError,
                 "direct path on {}: {} slices per reduction, at most {} supported", name_, m,
                 cuda::kMaxSlices);
    cuda::SliceArgs a{};
    for (int j = 0; j < m; ++j) a.src[j] = srcs[j];
    SSHSDP_CUDA_DIRECT_OK(cudaSetDevice(ordinal_));
    SSHSDP_CUDA_DIRECT_OK(cuda::LaunchReduceSlices(a, m, src_dtype == DType::kBF16, out,
                                                   out_dtype == DType::kBF16,
                                                   static_cast<int64_t>(n), accumulate, stream_));
  }

  void Complete() override { SSHSDP_CUDA_DIRECT_OK(cudaStreamSynchronize(stream_)); }

  void ToHost(void* host, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    SSHSDP_CUDA_DIRECT_OK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    Complete();
  }
  void FromHost(void* dst, const void* host, size_t bytes) override {
    if (bytes == 0) return;
    SSHSDP_CUDA_DIRECT_OK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
    Complete();
  }

 private:
  int ordinal_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<DirectDeviceMemory> MakeCudaDirectMemory(const Backend& backend) {
  const std::string name = backend.name();
  SSHSDP_CHECK(name.starts_with("cuda:"), DeviceError,
               "the direct path's device memory needs a cuda backend, got {}", name);
  return std::make_unique<CudaDirectMemory>(std::atoi(name.c_str() + 5), name);
}

}  // namespace sshsdp
