// MemoryAccount: bytes allocated by category (weights, main weights, gradients, optimizer
// state, gather buffers, ...), current and peak, for one rank.
//
// Data-tree roots report their allocations here so that benchmarks and tests can print and
// assert framework-accounted memory exactly (docs/design.md, Measurement rules). It is a context
// object: the engine owns one and passes it down; nothing is global.
//
//   MemoryAccount acct;
//   acct.Allocate("main_weights", 4096);
//   acct.Free("main_weights", 4096);
//   acct.peak_total();   // 4096
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace sshsdp {

class MemoryAccount {
 public:
  struct Usage {
    uint64_t current = 0;
    uint64_t peak = 0;
    uint64_t allocations = 0;  // number of Allocate calls
  };

  void Allocate(const std::string& category, uint64_t bytes) {
    Usage& u = by_category_[category];
    u.current += bytes;
    u.allocations += 1;
    if (u.current > u.peak) u.peak = u.current;
    total_ += bytes;
    if (total_ > peak_total_) peak_total_ = total_;
  }

  void Free(const std::string& category, uint64_t bytes) {
    Usage& u = by_category_[category];
    u.current -= bytes;
    total_ -= bytes;
  }

  const std::map<std::string, Usage>& by_category() const { return by_category_; }
  uint64_t current(const std::string& category) const {
    auto it = by_category_.find(category);
    return it == by_category_.end() ? 0 : it->second.current;
  }
  uint64_t peak_total() const { return peak_total_; }

 private:
  std::map<std::string, Usage> by_category_;
  uint64_t total_ = 0;
  uint64_t peak_total_ = 0;
};

}  // namespace sshsdp
