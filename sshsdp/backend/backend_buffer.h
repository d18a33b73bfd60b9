// BackendBuffer: memory of one backend owned by a model or an engine part, grown on demand —
// a model's activation arena and scratch (llm.c's one allocation with a table of offsets, in
// the backend's memory).
//
//   BackendBuffer acts(backend);
//   float* a = acts.Reserve<float>(n);   // at least n floats; a growth does not keep contents
//   int64_t bytes = acts.bytes();
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "sshsdp/backend/backend.h"

namespace sshsdp {

class BackendBuffer {
 public:
  explicit BackendBuffer(Backend& b) : b_(&b) {}
  ~BackendBuffer() { b_->Free(p_); }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  // At least n elements of T, 64-byte aligned. A growth frees the old block (on a device that
  // waits for its queued users) and keeps nothing of it; n <= 0 returns what is held.
  template <typename T>
  T* Reserve(int64_t n) {
    const size_t bytes = n > 0 ? static_cast<size_t>(n) * sizeof(T) : 0;
    if (bytes > bytes_) {
      b_->Free(p_);
      p_ = nullptr;
      bytes_ = 0;
      p_ = b_->Alloc(bytes);
      bytes_ = bytes;
    }
    return static_cast<T*>(p_);
  }
  template <typename T>
  T* data() const {
    return static_cast<T*>(p_);
  }
  // What Reserve has asked for at most (the model's accounted bytes).
  int64_t bytes() const { return static_cast<int64_t>(bytes_); }

 private:
  Backend* b_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace sshsdp
