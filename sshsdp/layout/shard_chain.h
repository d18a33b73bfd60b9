// ShardChain: the hierarchical shards W -> Wᶻ³ -> Wᶻ² -> Wᶻ¹ of one tensor list on one rank.
//
// Each level's local shard is one contiguous element range of the padded flat buffer
// (Topology fixes which chunk a rank owns). Every member tensor inherits the chain: its
// fragment at a level is the intersection of its element range with the local range
// (possibly empty), recorded with its position in the original tensor, so an update
// executor can find who owns which part of any unit. A shard-chain link never creates a
// data-tree parent/child link by itself (paper §3.2); storage is the data tree's business.
//
//   ShardChain chain(list, topo, /*rank=*/2);
//   Range z1 = chain.LocalRange(Shard::kZero1);           // elements [begin, end)
//   for (const Fragment& f : chain.Fragments(Shard::kZero1)) { ... f.member, f.tensor_begin ... }
//   auto owners = chain.Zero1Owners(/*member=*/1, 0, 8);  // who holds elements [0, 8) of member 1
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "sshsdp/layout/tensor_list.h"
#include "sshsdp/layout/topology.h"

namespace sshsdp {

struct Range {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const Range& a, const Range& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

// Intersection (empty range at max(begin) when disjoint).
Range Intersect(Range a, Range b);

// Part of a member tensor that lies in one shard.
struct Fragment {
  int member = 0;
  size_t tensor_begin = 0;  // first element, as an index into the original (flattened) tensor
  size_t shard_offset = 0;  // first element, as an offset into the local shard
  size_t length = 0;
  size_t tensor_end() const { return tensor_begin + length; }
};

// A fragment of a member at ZeRO-1 together with the rank that owns it.
struct OwnedFragment {
  int rank = 0;
  int zero1_chunk = 0;
  Fragment fragment;
};

class ShardChain {
 public:
  // `list` must be finalized with padded_numel() a multiple of so (and so of sg, sw):
  // throws LayoutError otherwise. Keeps a reference to `list` and a copy of `topo`.
  ShardChain(const TensorList& list, const Topology& topo, int rank);
  // Not copyable: a copy would hold the same reference to `list` and could outlive it.
  // Movable (into containers); the moved-from chain is not used again.
  ShardChain(const ShardChain&) = delete;
  ShardChain& operator=(const ShardChain&) = delete;
  ShardChain(ShardChain&&) noexcept = default;

  const TensorList& list() const { return list_; }
  const Topology& topology() const { return topo_; }

  // Elements of the padded buffer in one chunk at `level` (padded_numel / degree).
  size_t ChunkSize(Shard level) const;
  // Range of chunk `index` at `level`.
  Range ChunkRange(Shard level, int index) const;
  // This rank's local range at `level`.
  Range LocalRange(Shard level) const { return local_[static_cast<int>(level)]; }
  // Range of any rank's shard at `level`.
  Range RankRange(Shard level, int rank) const;

  // Non-empty fragments of all members inside this rank's shard at `level`, in buffer order.
  const std::vector<Fragment>& Fragments(Shard level) const {
    return fragments_[static_cast<int>(level)];
  }
  // Fragment of member `m` at `level` on this rank (nullopt when empty).
  std::optional<Fragment> MemberFragment(int m, Shard level) const;
  // Fragment of member `m` inside an arbitrary buffer range (nullopt when empty).
  std::optional<Fragment> FragmentIn(int m, Range range) const;

  // Which ranks of HSDP replica `replica` own which fragments of elements [a, b) of member
  // `m` at ZeRO-1, in tensor order. Fragments partition [a, b) exactly.
  std::vector<OwnedFragment> Zero1Owners(int m, size_t a, size_t b, int replica) const;
  // Same, in this rank's own HSDP replica.
  std::vector<OwnedFragment> Zero1Owners(int m, size_t a, size_t b) const;

 private:
  const TensorList& list_;
  Topology topo_;
  int rank_;
  Range local_[kNumShardLevels];
  std::vector<Fragment> fragments_[kNumShardLevels];
};

}  // namespace sshsdp
