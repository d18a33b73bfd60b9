// ShardChain: per-level local ranges, member fragments and ZeRO-1 ownership lookup.
#include "sshsdp/layout/shard_chain.h"

#include <algorithm>

#include "sshsdp/base/error.h"

namespace sshsdp {

Range Intersect(Range a, Range b) {
  size_t lo = std::max(a.begin, b.begin);
  size_t hi = std::min(a.end, b.end);
  return Range{lo, std::max(lo, hi)};
}

ShardChain::ShardChain(const TensorList& list, const Topology& topo, int rank)
    : list_(list), topo_(topo), rank_(rank) {
  SSHSDP_CHECK(list.finalized(), LayoutError,
               "shard chain of tensor list '{}': finalize the list first", list.name());
  SSHSDP_CHECK(list.padded_numel() % static_cast<size_t>(topo.so()) == 0, LayoutError,
               "shard chain of tensor list '{}': padded size {} is not a multiple of so={}; "
               "finalize the list with pad_multiple = so",
               list.name(), list.padded_numel(), topo.so());
  SSHSDP_CHECK(rank >= 0 && rank < topo.world(), LayoutError,
               "shard chain of tensor list '{}': rank {} outside world of {}", list.name(), rank,
               topo.world());
  for (int l = 0; l < kNumShardLevels; ++l) {
    Shard level = static_cast<Shard>(l);
    local_[l] = RankRange(level, rank);
    for (size_t m = 0; m < list.num_members(); ++m) {
      auto f = FragmentIn(static_cast<int>(m), local_[l]);
      if (f) fragments_[l].push_back(*f);
    }
  }
}

size_t ShardChain::ChunkSize(Shard level) const {
  return list_.padded_numel() / static_cast<size_t>(topo_.Degree(level));
}

Range ShardChain::ChunkRange(Shard level, int index) const {
  SSHSDP_CHECK(index >= 0 && index < topo_.Degree(level), LayoutError,
               "tensor list '{}': chunk {} outside [0, {}) at level {}", list_.name(), index,
               topo_.Degree(level), ShardName(level));
  size_t c = ChunkSize(level);
  return Range{c * static_cast<size_t>(index), c * static_cast<size_t>(index + 1)};
}

Range ShardChain::RankRange(Shard level, int rank) const {
  return ChunkRange(level, topo_.ChunkIndex(level, rank));
}

std::optional<Fragment> ShardChain::FragmentIn(int m, Range range) const {
  const TensorListMember& mem = list_.member(static_cast<size_t>(m));
  Range r = Intersect(Range{mem.offset, mem.end()}, range);
  if (r.empty()) return std::nullopt;
  Fragment f;
  f.member = m;
  f.tensor_begin = r.begin - mem.offset;
  f.shard_offset = r.begin - range.begin;
  f.length = r.size();
  return f;
}

std::optional<Fragment> ShardChain::MemberFragment(int m, Shard level) const {
  return FragmentIn(m, LocalRange(level));
}

std::vector<OwnedFragment> ShardChain::Zero1Owners(int m, size_t a, size_t b, int replica) const {
  const TensorListMember& mem = list_.member(static_cast<size_t>(m));
  SSHSDP_CHECK(a <= b && b <= mem.numel, LayoutError,
               "tensor list '{}': elements [{}, {}) outside member '{}' of {} elements",
               list_.name(), a, b, mem.name, mem.numel);
  std::vector<OwnedFragment> out;
  if (a == b) return out;
  size_t c = ChunkSize(Shard::kZero1);
  size_t first = (mem.offset + a) / c, last = (mem.offset + b - 1) / c;
  for (size_t j = first; j <= last; ++j) {
    Range chunk{j * c, (j + 1) * c};
    Range r = Intersect(Range{mem.offset + a, mem.offset + b}, chunk);
    OwnedFragment o;
    o.zero1_chunk = static_cast<int>(j);
    o.rank = topo_.Zero1ChunkOwner(static_cast<int>(j), replica);
    o.fragment.member = m;
    o.fragment.tensor_begin = r.begin - mem.offset;
    o.fragment.shard_offset = r.begin - chunk.begin;
    o.fragment.length = r.size();
    out.push_back(o);
  }
  return out;
}

std::vector<OwnedFragment> ShardChain::Zero1Owners(int m, size_t a, size_t b) const {
  return Zero1Owners(m, a, b, topo_.Coord(rank_).d);
}

}  // namespace sshsdp
