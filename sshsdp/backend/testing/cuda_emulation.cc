// The CPU emulation of CUDA (cuda_emulation.h): the block scheduler with one fiber per thread,
// and the CUDA runtime and cuBLAS functions backend/cuda_backend.cc calls, defined here so a test
// binary links this file in place of libcudart and libcublas. Memory is host memory, streams and
// events complete at once, and cuBLAS's GEMMs are the CPU backend's (oneDNN).
// Under AddressSanitizer (scripts/sanitize.sh) every stack switch is announced to it
// (__sanitizer_start/finish_switch_fiber), "device" allocations and each launch's dynamic
// shared memory are exactly their size, so a kernel reading past a buffer or past its shared
// memory is reported where it reads.
#include "sshsdp/backend/testing/cuda_emulation.h"

#include <cublas_v2.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sshsdp/kernels/matmul.h"
#include "sshsdp/numerics/dtype.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define SSHSDP_EMU_ASAN 1
#else
#define SSHSDP_EMU_ASAN 0
#endif

namespace sshsdp::emu {
namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr size_t kMaxDynamicShared = 48 * 1024;  // without cudaFuncSetAttribute's opt-in

// A fiber's saved context. On x86-64 a switch saves the callee-saved registers on the old stack
// and moves to the other (no system call: ucontext's swapcontext saves the signal mask with one,
// which made a barrier-heavy kernel cost minutes); elsewhere, ucontext.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
  const void* stack = nullptr;  // for AddressSanitizer: this context's stack (null: not known
  size_t stack_bytes = 0;       // yet, the scheduler's until a fiber first enters)
};
extern "C" void sshsdp_emu_switch(void** save_sp, void* to_sp);
asm(R"(
  .text
  .globl sshsdp_emu_switch
  .type sshsdp_emu_switch, @function
sshsdp_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sshsdp_emu_switch, .-sshsdp_emu_switch
)");
// Defined after Grid (it records the scheduler's stack under AddressSanitizer).
void Switch(Context& from, Context& to);
// A context that enters `entry` (which never returns) on the stack [stack, stack + bytes).
void Start(Context& c, char* stack, size_t bytes, void (*entry)(), Context&) {
  c.stack = stack;
  c.stack_bytes = bytes;
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                              // entry's return address: it never returns
  *--sp = reinterpret_cast<void*>(entry);       // popped by the switch's ret
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp, rbx, r12-r15
  c.sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};
void Switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
void Start(Context& c, char* stack, size_t bytes, void (*entry)(), Context& link) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = &link.uc;
  makecontext(&c.uc, entry, 0);
}
#endif

struct Fiber {
  Context ctx;
  dim3 idx;
  bool started = false;  // parked at the end of its loop (or never run): may take a new block
  bool at_barrier = false;
  bool done = false;
};

// The running grid (one at a time: RunGrid holds the lock). Fibers live across blocks and
// launches: each runs the kernel for its thread of the current block, then parks.
struct Grid {
  std::mutex mu;
  Context scheduler;
  std::vector<std::unique_ptr<Fiber>> fibers;  // not moved: a ucontext points into itself
  std::vector<std::unique_ptr<char[]>> stacks;
  std::unique_ptr<unsigned char[]> shared;  // this launch's dynamic shared memory, exactly
  size_t shared_bytes = 0;
  Fiber* current = nullptr;
  const std::function<void()>* kernel = nullptr;
  dim3 block_idx, block_dim, grid_dim;
};
Grid& G() {
  static Grid g;
  return g;
}

#if defined(__x86_64__)
void Switch(Context& from, Context& to) {
#if SSHSDP_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, to.stack, to.stack_bytes);
  sshsdp_emu_switch(&from.sp, to.sp);
  const void* came_from = nullptr;
  size_t came_from_bytes = 0;
  __sanitizer_finish_switch_fiber(fake_stack, &came_from, &came_from_bytes);
  // A fiber is only ever resumed by the scheduler, which may run on another host thread than
  // at the fiber's last switch: its stack is the one just left.
  Context& scheduler = G().scheduler;
  if (&from != &scheduler) {
    scheduler.stack = came_from;
    scheduler.stack_bytes = came_from_bytes;
  }
#else
  sshsdp_emu_switch(&from.sp, to.sp);
#endif
}
#endif
thread_local cudaError_t last_error = cudaSuccess;
std::atomic<int64_t> events_created{0};  // any thread may create one (a handle per thread)

void FiberMain() {
#if SSHSDP_EMU_ASAN && defined(__x86_64__)
  // The first entry comes from the scheduler's Switch: complete its announcement, and learn the
  // scheduler's stack (the host thread's) for the switches back.
  Context& s = G().scheduler;
  __sanitizer_finish_switch_fiber(nullptr, &s.stack, &s.stack_bytes);
#endif
  for (;;) {
    Grid& g = G();
    (*g.kernel)();
    Fiber* f = g.current;
    f->done = true;
    Switch(f->ctx, g.scheduler);
  }
}

// SSHSDP_CUDA_EMULATION_ORDER: forward (unset: the same) or reverse; another value is a typo
// that would silently test the forward order, so the process stops naming it.
bool Reverse() {
  static const bool reverse = [] {
    const char* e = std::getenv("SSHSDP_CUDA_EMULATION_ORDER");
    const std::string v = e ? e : "forward";
    if (v != "forward" && v != "reverse") {
      std::fprintf(stderr,
                   "cuda emulation: SSHSDP_CUDA_EMULATION_ORDER=%s is neither forward nor reverse "
                   "(unset it, or set one of the two)\n",
                   v.c_str());
      std::exit(2);
    }
    return v == "reverse";
  }();
  return reverse;
}

void Fail(cudaError_t e, const std::string& why) {
  std::fprintf(stderr, "cuda emulation: %s\n", why.c_str());
  if (last_error == cudaSuccess) last_error = e;
}

// One block: every fiber runs to its next barrier or its end; a barrier opens once every
// fiber is at it. Returns false (and records the error) on a barrier some threads never reach;
// the fibers left inside the kernel then start afresh.
bool RunBlock(Grid& g, size_t threads, bool reverse) {
  const dim3& b = g.block_dim;
  for (size_t i = 0; i < threads; ++i) {
    Fiber& f = *g.fibers[i];
    if (!f.started) {
      Start(f.ctx, g.stacks[i].get(), kStackBytes, FiberMain, g.scheduler);
      f.started = true;
    }
    f.at_barrier = f.done = false;
    f.idx = dim3(static_cast<unsigned>(i % b.x), static_cast<unsigned>(i / b.x % b.y),
                 static_cast<unsigned>(i / (size_t{b.x} * b.y)));
  }
  std::fill_n(g.shared.get(), g.shared_bytes, static_cast<unsigned char>(0xFF));
  for (;;) {
    size_t waiting = 0, finished = 0;
    for (size_t n = 0; n < threads; ++n) {
      Fiber& f = *g.fibers[reverse ? threads - 1 - n : n];
      if (f.done) continue;
      f.at_barrier = false;
      g.current = &f;
      Switch(g.scheduler, f.ctx);
      g.current = nullptr;
      if (f.done) ++finished;
      if (f.at_barrier) ++waiting;
    }
    if (waiting == 0) return true;
    if (finished > 0 || waiting != threads) {
      for (size_t i = 0; i < threads; ++i)
        if (!g.fibers[i]->done) g.fibers[i]->started = false;
      Fail(cudaErrorLaunchFailure, "__syncthreads() not reached by every thread of block (" +
                                       std::to_string(g.block_idx.x) + ", " +
                                       std::to_string(g.block_idx.y) + ", " +
                                       std::to_string(g.block_idx.z) + ")");
      return false;
    }
  }
}

}  // namespace

const dim3& ThreadIdx() { return G().current->idx; }
const dim3& BlockIdx() { return G().block_idx; }
const dim3& BlockDim() { return G().block_dim; }
const dim3& GridDim() { return G().grid_dim; }
void* DynamicShared() { return G().shared.get(); }
int64_t EventsCreated() { return events_created.load(); }

void SyncThreads() {
  Grid& g = G();
  Fiber* f = g.current;
  f->at_barrier = true;
  Switch(f->ctx, g.scheduler);
}

void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel) {
  const size_t threads = size_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7FFFFFFFu || grid.y > 65535 ||
      grid.z > 65535) {
    Fail(cudaErrorInvalidConfiguration,
         "launch of grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
             std::to_string(grid.z) + ") x block (" + std::to_string(block.x) + ", " +
             std::to_string(block.y) + ", " + std::to_string(block.z) + ") is out of limits");
    return;
  }
  if (shared_bytes > kMaxDynamicShared) {
    Fail(cudaErrorInvalidValue, std::to_string(shared_bytes) +
                                    " bytes of dynamic shared memory: more than 48 KiB needs "
                                    "cudaFuncSetAttribute's opt-in");
    return;
  }
  Grid& g = G();
  std::lock_guard<std::mutex> lock(g.mu);
  while (g.stacks.size() < threads) g.stacks.emplace_back(new char[kStackBytes]);
  while (g.fibers.size() < threads) g.fibers.push_back(std::make_unique<Fiber>());
  g.shared.reset(new unsigned char[shared_bytes]);  // its size: a read past it is reported
  g.shared_bytes = shared_bytes;
  g.kernel = &kernel;
  g.block_dim = block;
  g.grid_dim = grid;
  const bool reverse = Reverse();
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g.block_idx = dim3(x, y, z);
        if (!RunBlock(g, threads, reverse)) return;
      }
}

}  // namespace sshsdp::emu

// ---- The CUDA runtime, as far as cuda_backend.cc uses it: one device, host memory. ----
extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = sshsdp::emu::last_error;
  sshsdp::emu::last_error = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(p, 0, sizeof(*p));
  std::snprintf(p->name, sizeof(p->name), "CUDA emulated on the CPU");
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
// 256-byte aligned as cudaMalloc's, and exactly `bytes` long (a kernel's overrun is
// AddressSanitizer's to see).
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (posix_memalign(p, 256, std::max<size_t>(bytes, 1)) != 0) *p = nullptr;
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
// A stream or an event is a distinct non-null handle; every operation has completed.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  sshsdp::emu::events_created.fetch_add(1);
  *e = reinterpret_cast<cudaEvent_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

// ---- cuBLAS: its column-major GEMMs on the CPU backend's GEMM. ----
struct cublasContext {};

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}

}  // extern "C"

namespace {

// C[m, n] = alpha·op(A)·op(B) + beta·C, column-major, beta 0 (C not read) or 1: the CPU
// backend's GEMM (kernels/matmul.h, oneDNN) on the row-major reading of the same memory,
// Cᵀ = op(B)ᵀ·op(A)ᵀ — so the emulated CUDA backend's products are the CPU backend's bits and
// a difference between the two backends lies in the kernels.
cublasStatus_t Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt,
                    int ldb, float beta, float* C, int ldc) {
  const auto ok_op = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T; };
  if (!ok_op(ta) || !ok_op(tb) || m < 0 || n < 0 || k < 0 || ldc < std::max(1, m) ||
      lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || at != bt || (beta != 0.0f && beta != 1.0f))
    return CUBLAS_STATUS_INVALID_VALUE;
  try {
    sshsdp::kernels::GemmStrided(tb == CUBLAS_OP_T, ta == CUBLAS_OP_T, n, m, k, B, ldb, A, lda,
                                 at == CUDA_R_16BF ? sshsdp::DType::kBF16 : sshsdp::DType::kF32, C,
                                 ldc, sshsdp::DType::kF32, beta == 1.0f, alpha);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda emulation: GEMM refused: %s\n", e.what());
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                         int m, int n, int k, const float* alpha, const float* A,
                                         int lda, long long int sa, const float* B, int ldb,
                                         long long int sb, const float* beta, float* C, int ldc,
                                         long long int sc, int batch) {
  for (int b = 0; b < batch; ++b) {
    const cublasStatus_t s = Gemm(ta, tb, m, n, k, *alpha, A + b * sa, CUDA_R_32F, lda, B + b * sb,
                                  CUDA_R_32F, ldb, *beta, C + b * sc, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* A, cudaDataType at,
                            int lda, const void* B, cudaDataType bt, int ldb, const void* beta,
                            void* C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  const auto ok_type = [](cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; };
  if (!ok_type(at) || !ok_type(bt) || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return Gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
              *static_cast<const float*>(beta), static_cast<float*>(C), ldc);
}

}  // extern "C"
