// A test backend whose memory the host cannot touch: the CPU backend's ops on memory mapped
// PROT_NONE except while one of the backend's own calls runs. (Given a ShmDeviceMemory it
// allocates that stand-in device's memory instead, unguarded: the engine on several ranks
// over the direct path, whose copies and reductions touch it from the comm layer.) An engine on it
// that reads or writes a data-tree root, a transient block or the model's activations from the host
// — instead of through the backend, as it must on a GPU — dies with SIGSEGV, so a test on it proves
// the engine routes every access to backend memory through the backend, on a machine without a GPU.
// NewStream's handles share the guard: the regions open while any handle's call runs (counted,
// under a mutex), so the communication thread's staged copies may run beside the compute
// thread's ops; a host access made exactly while another thread is inside a call goes unseen.
// Deferred (the second argument), a handle's ops queue as on a GPU stream and run only at its
// own Synchronize, host copy, value-returning op or Free, or when a thread waits for an event
// recorded on it (up to the event) — never at another handle's call — so a hand-off missing its
// synchronization reads stale memory here too, on a machine without a GPU. A queued op's error
// surfaces at the handle's next synchronizing call, and at every wait for an event recorded
// after it (sticky, as a CUDA context's error). A flush
// opens every region for the whole queue, which widens the window in which another thread's
// host access goes unseen.
//
//   testing::GuardedBackend b;
//   cfg.backend = &b;
//   Gpt model(TestGpt(), b);                  // the model's ops through it too
//   Engine engine(model, *world, cfg);        // any host access to b's memory faults
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sshsdp/backend/backend.h"
#include "sshsdp/base/error.h"
#include "sshsdp/comm/testing/shm_device_memory.h"

namespace sshsdp::testing {

class GuardedBackend final : public Backend {
 public:
  // deferred: ops queue like a GPU stream's and run only when this handle synchronizes (see
  // the top of the file).
  explicit GuardedBackend(ShmDeviceMemory* device = nullptr, bool deferred = false)
      : cpu_(MakeBackend("cpu")),
        device_(device),
        guard_(std::make_shared<Guard>()),
        deferred_(deferred) {}
  ~GuardedBackend() override {
    ReleaseScratch();  // the typed ops' defaults ran through this handle
    Flush();
    ReportPendingError();
    std::lock_guard<std::mutex> lock(guard_->mu);
    if (--guard_->handles > 0) return;  // another handle still uses the regions
    for (auto& [p, bytes] : guard_->regions) munmap(p, bytes);
  }
  std::string name() const override { return "guarded-cpu"; }
  int64_t calls() const {
    std::lock_guard<std::mutex> lock(guard_->mu);
    return guard_->calls;
  }
  std::unique_ptr<Backend> NewStream() override {
    return std::unique_ptr<Backend>(new GuardedBackend(device_, guard_, deferred_));
  }

  void* AllocHost(size_t bytes) override { return cpu_->AllocHost(bytes); }
  void FreeHost(void* p) override { cpu_->FreeHost(p); }
  void* Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    if (device_) return device_->Alloc(bytes);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t len = (bytes + page - 1) / page * page;
    std::lock_guard<std::mutex> lock(guard_->mu);
    const int prot = guard_->open > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    void* p = mmap(nullptr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SSHSDP_CHECK(p != MAP_FAILED, DeviceError, "guarded-cpu: mmap of {} bytes failed", bytes);
    guard_->regions[p] = len;
    return p;
  }
  void Free(void* p) override {
    Flush();  // this handle's queued work first (cudaFree waits for the whole device's)
    ReportPendingError();  // Free never throws
    if (device_) return device_->Free(p);
    std::lock_guard<std::mutex> lock(guard_->mu);
    auto it = guard_->regions.find(p);
    if (it == guard_->regions.end()) return;
    munmap(it->first, it->second);
    guard_->regions.erase(it);
  }
  // Host copies wait for this handle's queued ops first, as a stream's copies do.
  void CopyIn(void* dst, const void* src, size_t bytes) override {
    Sync();
    Open o(this);
    cpu_->CopyIn(dst, src, bytes);
  }
  void CopyOut(void* dst, const void* src, size_t bytes) override {
    Sync();
    Open o(this);
    cpu_->CopyOut(dst, src, bytes);
  }
  // Staged as on a GPU: the bytes are copied now and land when the queue reaches them.
  void Upload(void* dst, const void* src, size_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(src);
    auto staged = std::make_shared<std::vector<uint8_t>>(p, p + bytes);
    Run([=, this] { cpu_->CopyIn(dst, staged->data(), bytes); });
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Run([=, this] { cpu_->Copy(dst, src, bytes); });
  }
  void Synchronize() override { Sync(); }
  // Calls on this handle that waited for its queue (Synchronize, host copies, value-returning
  // ops): what makes a host thread stall on a GPU.
  int64_t host_waits() const { return host_waits_; }
  std::shared_ptr<BackendEvent> RecordEvent() override {
    uint64_t mark = 0;
    {
      std::lock_guard<std::mutex> lock(queue_->mu);
      mark = queue_->queued;
    }
    return std::make_shared<Event>(queue_, guard_, mark);
  }

// A void op: queued (deferred) or run now; its arguments are copied (pointers: backend memory).
#define SSHSDP_GUARDED(call) Run([=, this] { cpu_->call; })
// An op returning a value to the host: the queue first, then the op.
#define SSHSDP_GUARDED_VALUE(call) \
  Sync();                          \
  Open o(this);                    \
  return cpu_->call
  void Fill(float* x, int64_t n, float v) override { SSHSDP_GUARDED(Fill(x, n, v)); }
  void Zero(void* x, size_t bytes) override { SSHSDP_GUARDED(Zero(x, bytes)); }
  void CastF32ToBf16(const float* x, bf16* y, int64_t n) override {
    SSHSDP_GUARDED(CastF32ToBf16(x, y, n));
  }
  void CastBf16ToF32(const bf16* x, float* y, int64_t n) override {
    SSHSDP_GUARDED(CastBf16ToF32(x, y, n));
  }
  void AdamW(const AdamWSpan* s, int count, const AdamWConfig& cfg, int64_t step,
             float scale) override {
    std::vector<AdamWSpan> spans(s, s + std::max(count, 0));  // the caller's may be gone by then
    Run([=, this] { cpu_->AdamW(spans.data(), count, cfg, step, scale); });
  }
  void MxQuantizeWeight(const float* w, int64_t rows, int64_t cols, uint8_t* q, uint8_t* scales,
                        const MxOptions& opt) override {
    SSHSDP_GUARDED(MxQuantizeWeight(w, rows, cols, q, scales, opt));
  }
  void MxDequantizeRows(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                        float* out, const MxOptions& opt) override {
    SSHSDP_GUARDED(MxDequantizeRows(q, scales, rows, cols, out, opt));
  }
  void MxDequantizeRowsBf16(const uint8_t* q, const uint8_t* scales, int64_t rows, int64_t cols,
                            bf16* out, const MxOptions& opt) override {
    SSHSDP_GUARDED(MxDequantizeRowsBf16(q, scales, rows, cols, out, opt));
  }
  double SumSquares(const float* x, int64_t n) override { SSHSDP_GUARDED_VALUE(SumSquares(x, n)); }
  void RmsNormForward(const float* x, const float* g, float* y, float* rstd, int64_t rows, int d,
                      float eps) override {
    SSHSDP_GUARDED(RmsNormForward(x, g, y, rstd, rows, d, eps));
  }
  void RmsNormBackward(const float* dy, const float* x, const float* g, const float* rstd,
                       float* dx, float* dg, int64_t rows, int d, bool acc) override {
    SSHSDP_GUARDED(RmsNormBackward(dy, x, g, rstd, dx, dg, rows, d, acc));
  }
  void GeluForward(const float* x, float* y, int64_t n) override {
    SSHSDP_GUARDED(GeluForward(x, y, n));
  }
  void GeluBackwardInPlace(const float* x, float* dy, int64_t n) override {
    SSHSDP_GUARDED(GeluBackwardInPlace(x, dy, n));
  }
  void SwigluForward(const float* h1, const float* h3, float* a, int64_t n) override {
    SSHSDP_GUARDED(SwigluForward(h1, h3, a, n));
  }
  void SwigluBackward(const float* h1, const float* h3, const float* da, float* dh1, float* dh3,
                      int64_t n) override {
    SSHSDP_GUARDED(SwigluBackward(h1, h3, da, dh1, dh3, n));
  }
  void SoftmaxCrossEntropyForward(float* logits, const int32_t* targets, float* losses,
                                  int64_t rows, int64_t V, int64_t ld, double* total) override {
    SSHSDP_GUARDED(SoftmaxCrossEntropyForward(logits, targets, losses, rows, V, ld, total));
  }
  void SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits,
                                   int64_t rows, int64_t ld, float scale) override {
    SSHSDP_GUARDED(SoftmaxCrossEntropyBackward(probs, targets, dlogits, rows, ld, scale));
  }
  void EmbeddingForward(const float* wte, const float* wpe, const int32_t* tokens, int B, int T,
                        int d, float* out) override {
    SSHSDP_GUARDED(EmbeddingForward(wte, wpe, tokens, B, T, d, out));
  }
  void EmbeddingBackward(const float* dx, const int32_t* tokens, int B, int T, int d, float* dwte,
                         int64_t vocab, float* dwpe, int64_t seq_len, bool acc) override {
    SSHSDP_GUARDED(EmbeddingBackward(dx, tokens, B, T, d, dwte, vocab, dwpe, seq_len, acc));
  }
  void CausalAttentionForward(const float* qkv, float* out, float* lse, int B, int T, int H,
                              int dh) override {
    SSHSDP_GUARDED(CausalAttentionForward(qkv, out, lse, B, T, H, dh));
  }
  void CausalAttentionBackward(const float* dout, const float* qkv, const float* out,
                               const float* lse, float* dqkv, int B, int T, int H,
                               int dh) override {
    SSHSDP_GUARDED(CausalAttentionBackward(dout, qkv, out, lse, dqkv, B, T, H, dh));
  }
  void Add(const float* a, const float* b, float* y, int64_t n) override {
    SSHSDP_GUARDED(Add(a, b, y, n));
  }
  void MoeTopK(float* score, int64_t N, int E, int k, const kernels::MoeRouterOptions& opt,
               int32_t* sel, float* gate) override {
    SSHSDP_GUARDED(MoeTopK(score, N, E, k, opt, sel, gate));
  }
  void MoeExpertStats(const float* score, const int32_t* sel, int64_t N, int E, int k,
                      const kernels::MoeRouterOptions& opt, int32_t* count, double* psum) override {
    SSHSDP_GUARDED(MoeExpertStats(score, sel, N, E, k, opt, count, psum));
  }
  void MoePermute(const int32_t* sel, const int32_t* offsets, int64_t N, int E, int k, int32_t* row,
                  int32_t* token) override {
    SSHSDP_GUARDED(MoePermute(sel, offsets, N, E, k, row, token));
  }
  void MoeRouterBackward(const float* score, const int32_t* sel, const float* gate,
                         const float* frac, const float* dgate, int64_t N, int E, int k,
                         const kernels::MoeRouterOptions& opt, float* dz) override {
    SSHSDP_GUARDED(MoeRouterBackward(score, sel, gate, frac, dgate, N, E, k, opt, dz));
  }
  void GatherRows(const float* src, const int32_t* idx, float* dst, int64_t rows,
                  int64_t d) override {
    SSHSDP_GUARDED(GatherRows(src, idx, dst, rows, d));
  }
  void MoeCombine(const float* yp, const int32_t* row, const float* gate, float* out, int64_t N,
                  int k, int64_t d, bool acc) override {
    SSHSDP_GUARDED(MoeCombine(yp, row, gate, out, N, k, d, acc));
  }
  void MoeCombineBackward(const float* dy, const float* yp, const int32_t* row, const float* gate,
                          float* dgate, float* dyp, int64_t N, int k, int64_t d) override {
    SSHSDP_GUARDED(MoeCombineBackward(dy, yp, row, gate, dgate, dyp, N, k, d));
  }
  void MoeUnpermuteSum(const float* dxp, const int32_t* row, float* dx, int64_t N, int k,
                       int64_t d) override {
    SSHSDP_GUARDED(MoeUnpermuteSum(dxp, row, dx, N, k, d));
  }
  void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
            float* c, bool acc) override {
    SSHSDP_GUARDED(Gemm(ta, tb, m, n, k, a, b, c, acc));
  }
  void GemmBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bf16* a, const bf16* b,
                float* c, bool acc) override {
    SSHSDP_GUARDED(GemmBf16(ta, tb, m, n, k, a, b, c, acc));
  }
  void NewtonSchulz(const void* const* in, DType in_dtype, float* const* out, int64_t batch,
                    int64_t rows, int64_t cols, int steps, const NsCoefficients& coef,
                    float scale) override {
    std::vector<const void*> ins(in, in + std::max<int64_t>(batch, 0));
    std::vector<float*> outs(out, out + std::max<int64_t>(batch, 0));
    Run([=, this] {
      cpu_->NewtonSchulz(ins.data(), in_dtype, outs.data(), batch, rows, cols, steps, coef, scale);
    });
  }
  void MuonMomentum(const float* grad, float* m, void* u, DType u_dtype, int64_t n, float mu,
                    bool nesterov, float grad_scale) override {
    SSHSDP_GUARDED(MuonMomentum(grad, m, u, u_dtype, n, mu, nesterov, grad_scale));
  }
  void MuonWeightUpdate(float* w, const float* v, int64_t n, float lr, float wd) override {
    SSHSDP_GUARDED(MuonWeightUpdate(w, v, n, lr, wd));
  }
#undef SSHSDP_GUARDED
#undef SSHSDP_GUARDED_VALUE

 private:
  // What the handles of one guarded device share: its regions, how many handles and how many
  // calls are open.
  struct Guard {
    std::mutex mu;
    std::map<void*, size_t> regions;  // guarded regions (none with a ShmDeviceMemory)
    int handles = 1;
    int open = 0;
    int64_t calls = 0;
  };
  GuardedBackend(ShmDeviceMemory* device, std::shared_ptr<Guard> guard, bool deferred)
      : cpu_(MakeBackend("cpu")), device_(device), guard_(std::move(guard)), deferred_(deferred) {
    std::lock_guard<std::mutex> lock(guard_->mu);
    ++guard_->handles;
  }

  // Every region readable and writable while at least one backend call runs.
  struct Open {
    explicit Open(GuardedBackend* b, bool count = true) : Open(*b->guard_, count) {}
    explicit Open(Guard& g, bool count) : g_(g) {
      std::lock_guard<std::mutex> lock(g_.mu);
      g_.calls += count ? 1 : 0;
      if (g_.open++ == 0)
        for (auto& [p, len] : g_.regions) mprotect(p, len, PROT_READ | PROT_WRITE);
    }
    ~Open() {
      std::lock_guard<std::mutex> lock(g_.mu);
      if (--g_.open == 0)
        for (auto& [p, len] : g_.regions) mprotect(p, len, PROT_NONE);
    }
    Guard& g_;
  };
  // One handle's queue of deferred ops (its "stream"): a thread waiting for one of its events
  // runs it up to the event, so it is locked. Ops run under the lock, in order, one at a time.
  struct Queue {
    std::mutex mu;
    std::deque<std::function<void()>> ops;
    uint64_t queued = 0;       // ops ever queued
    uint64_t retired = 0;      // ops ever run or dropped
    std::exception_ptr error;  // the first failed op's error, until the owner raises it
    // The first failure ever, and the op's place (1-based): sticky, as a CUDA context's error —
    // every later event wait raises it, whether or not the owner has.
    std::exception_ptr failure;
    uint64_t failed_at = 0;
  };
  // Runs q's ops up to the `mark`-th; an op's error is kept and the rest of what is queued
  // dropped, as a CUDA stream's error surfaces — raised at the next synchronizing call, never
  // from Free or the destructor.
  static void RunQueue(Queue& q, Guard& guard, uint64_t mark) noexcept {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.retired >= mark) return;
    Open o(guard, /*count=*/false);
    while (q.retired < mark) {
      std::function<void()> op = std::move(q.ops.front());
      q.ops.pop_front();
      ++q.retired;
      try {
        op();
      } catch (...) {
        if (!q.error) q.error = std::current_exception();
        if (!q.failure) {
          q.failure = std::current_exception();
          q.failed_at = q.retired;
        }
        q.retired = q.queued;
        q.ops.clear();
      }
    }
  }
  struct Event final : BackendEvent {
    Event(std::shared_ptr<Queue> q, std::shared_ptr<Guard> g, uint64_t m)
        : queue(std::move(q)), guard(std::move(g)), mark(m) {}
    void Wait() override {
      RunQueue(*queue, *guard, mark);
      std::exception_ptr e;
      {
        std::lock_guard<std::mutex> lock(queue->mu);
        if (queue->failure && queue->failed_at <= mark) e = queue->failure;  // its ops or before
      }
      if (e) std::rethrow_exception(e);
    }
    std::shared_ptr<Queue> queue;
    std::shared_ptr<Guard> guard;
    uint64_t mark;
  };

  void Run(std::function<void()> op) {
    if (deferred_) {
      {
        std::lock_guard<std::mutex> lock(guard_->mu);
        ++guard_->calls;
      }
      std::lock_guard<std::mutex> lock(queue_->mu);
      queue_->ops.push_back(std::move(op));
      ++queue_->queued;
      return;
    }
    Open o(this);
    op();
  }
  void Flush() noexcept {
    uint64_t mark = 0;
    {
      std::lock_guard<std::mutex> lock(queue_->mu);
      mark = queue_->queued;
    }
    RunQueue(*queue_, *guard_, mark);
  }
  std::exception_ptr TakeError() {
    std::lock_guard<std::mutex> lock(queue_->mu);
    std::exception_ptr e = queue_->error;
    queue_->error = nullptr;
    return e;
  }
  void Sync() {
    ++host_waits_;
    Flush();
    if (std::exception_ptr e = TakeError()) std::rethrow_exception(e);
  }
  void ReportPendingError() noexcept {
    std::exception_ptr e = TakeError();
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "guarded-cpu: a queued op failed: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "guarded-cpu: a queued op failed\n");
    }
  }

  std::unique_ptr<Backend> cpu_;
  ShmDeviceMemory* device_ = nullptr;
  std::shared_ptr<Guard> guard_;
  bool deferred_ = false;
  int64_t host_waits_ = 0;
  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();  // deferred only; events share it
};

}  // namespace sshsdp::testing
