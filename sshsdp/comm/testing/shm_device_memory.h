// A stand-in "device" for the direct path's device mode (comm/direct_device.h) in host memory,
// for tests on machines without a GPU: regions are POSIX shared-memory segments that every node
// peer maps (as CUDA IPC maps device allocations), copies are memcpy, the reduction is
// HostReduceSlices, and only memory handed out by OpenRegions or Alloc counts as "device"
// memory — so the device-mode control flow of DirectCommunicator (mapped peer regions, pushes,
// reduction, completion before the flags, host staging of AllReduce and Exchange, the checks
// that refuse host buffers) runs and is checked on every CI machine. The CUDA implementation
// (device/cuda_direct_memory.h) replaces only these primitives.
//
//   ShmDeviceMemory mem;
//   auto d = DirectCommunicator::Create(MpiCommunicator::World(n), &mem);
//   float* recv = static_cast<float*>(mem.Alloc(count * 4));   // a "device" buffer
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/direct_device.h"

namespace sshsdp::testing {

class ShmDeviceMemory final : public DirectDeviceMemory {
 public:
  ~ShmDeviceMemory() override {
    for (auto& [p, bytes] : private_) munmap(p, bytes);
  }
  std::string name() const override { return "shm (host stand-in for a device)"; }

  std::vector<char*> OpenRegions(size_t bytes, int my_l, int L,
                                 const NodeAllGather& all_gather) override {
    static std::atomic<uint64_t> counter{0};
    char mine[64] = {};
    std::snprintf(mine, sizeof(mine), "/sshsdp-test-%d-%llu", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(counter++));
    std::vector<char*> bases(L, nullptr);
    bases[my_l] = Map(mine, bytes, /*create=*/true);
    std::vector<char> names(64 * static_cast<size_t>(L));
    all_gather(mine, names.data(), 64);
    int ok = bases[my_l] != nullptr ? 1 : 0;
    for (int l = 0; l < L; ++l) {
      if (l == my_l) continue;
      bases[l] = Map(&names[64 * static_cast<size_t>(l)], bytes, /*create=*/false);
      if (bases[l] == nullptr) ok = 0;
    }
    std::vector<int> all(L);
    all_gather(&ok, all.data(), sizeof(int));  // every peer mapped: the names may go
    shm_unlink(mine);
    for (int l = 0; l < L; ++l)
      SSHSDP_CHECK(all[l] == 1, CommError, "ShmDeviceMemory: member {} could not map a region", l);
    std::lock_guard<std::mutex> lock(mu_);
    for (char* b : bases) regions_[b] = bytes;
    return bases;
  }
  void CloseRegions(const std::vector<char*>& bases, int my_l,
                    const std::function<void()>& node_barrier) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t l = 0; l < bases.size(); ++l) {
        if (static_cast<int>(l) == my_l || bases[l] == nullptr) continue;
        munmap(bases[l], regions_[bases[l]]);
        regions_.erase(bases[l]);
      }
    }
    node_barrier();
    std::lock_guard<std::mutex> lock(mu_);
    munmap(bases[my_l], regions_[bases[my_l]]);
    regions_.erase(bases[my_l]);
  }

  // A private "device" buffer (send and recv buffers outside registered roots).
  void* Alloc(size_t bytes) {
    void* p = mmap(nullptr, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    SSHSDP_CHECK(p != MAP_FAILED, CommError, "ShmDeviceMemory: mmap of {} bytes failed", bytes);
    std::lock_guard<std::mutex> lock(mu_);
    private_[static_cast<char*>(p)] = bytes ? bytes : 1;
    regions_[static_cast<char*>(p)] = bytes ? bytes : 1;
    return p;
  }

  void Free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = private_.find(static_cast<char*>(p));
    if (it == private_.end()) return;
    munmap(it->first, it->second);
    regions_.erase(it->first);
    private_.erase(it);
  }

  bool IsDeviceMemory(const void* p, size_t bytes) const override {
    if (bytes == 0) return true;
    const char* c = static_cast<const char*>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.upper_bound(const_cast<char*>(c));
    if (it == regions_.begin()) return false;
    --it;
    return c >= it->first && c + bytes <= it->first + it->second;
  }
  void Copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void ReduceSlices(const void* const* srcs, DType src_dtype, int m, void* out, DType out_dtype,
                    size_t n, bool accumulate) override {
    HostReduceSlices(srcs, src_dtype, m, out, out_dtype, n, accumulate);
  }
  void Complete() override { std::atomic_thread_fence(std::memory_order_seq_cst); }
  // An empty copy may name null buffers (an empty vector's data()), which memcpy may not get.
  void ToHost(void* host, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, src, bytes);
  }
  void FromHost(void* dst, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host, bytes);
  }

 private:
  static char* Map(const char* name, size_t bytes, bool create) {
    const int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0) return nullptr;
    if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      close(fd);
      return nullptr;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }

  mutable std::mutex mu_;  // the comm thread asks IsDeviceMemory while the main thread maps
  std::map<char*, size_t> regions_;  // "device" memory: mapped regions and private buffers
  std::map<char*, size_t> private_;
};

}  // namespace sshsdp::testing
