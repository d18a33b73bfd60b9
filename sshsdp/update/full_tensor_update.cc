// FullTensorMuon: per-parameter all-gathers, redundant Newton–Schulz, own-shard updates (see
// full_tensor_update.h).
#include "sshsdp/update/full_tensor_update.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {}  // namespace

FullTensorMuon::FullTensorMuon(std::vector<FullTensorGroup> groups, std::vector<UpdateUnit> units,
                               const MuonConfig& cfg, int rank, Communicator& zero1,
                               Backend& backend, MemoryAccount* account)
    : groups_(std::move(groups)),
      units_(std::move(units)),
      cfg_(cfg),
      program_(MuonProgram(cfg, backend)),
      rank_(rank),
      comm_(zero1),
      account_(account) {
  SSHSDP_CHECK(!groups_.empty(), PlanError, "full_tensor Muon: no runtime groups");
  const Topology& topo = groups_.front().chain->topology();
  const int so = topo.so();
  SSHSDP_CHECK(comm_.size() == so && comm_.rank() == topo.ChunkIndex(Shard::kZero1, rank_),
               PlanError,
               "full_tensor Muon: communicator {} has {} ranks (this one at {}), but the ZeRO-1 "
               "group of rank {} in {} has {} ranks with this one at chunk {}",
               comm_.name(), comm_.size(), comm_.rank(), rank_, topo.ToString(), so,
               topo.ChunkIndex(Shard::kZero1, rank_));
  for (const UpdateUnit& u : units_) exec_cost_ += NewtonSchulzFlops(u.rows, u.cols, cfg_.ns_steps);

  // Gather items: consecutive units over the same update parameters.
  for (size_t i = 0; i < units_.size(); ++i) {
    const UpdateUnit& u = units_[i];
    if (items_.empty() || items_.back().group != u.group || items_.back().first != u.first_member ||
        items_.back().count != u.num_members) {
      GatherItem it;
      it.group = u.group;
      it.first = u.first_member;
      it.count = u.num_members;
      const FullTensorGroup& G = groups_[u.group];
      it.logical_begin = G.logical_offset[u.first_member];
      for (int p = u.first_member; p < u.first_member + u.num_members; ++p)
        it.numel += NumElements(G.layout->update[p].shape);
      items_.push_back(std::move(it));
    }
    items_.back().units.push_back(static_cast<int>(i));
  }

  // Contributions per ZeRO-1 chunk, send counts and the gathered → matrix mapping.
  std::vector<size_t> slack(groups_.size(), 0);
  for (GatherItem& it : items_) {
    const FullTensorGroup& G = groups_[it.group];
    const TensorList& list = G.layout->list;
    const size_t cs = list.padded_numel() / static_cast<size_t>(so);
    auto in_item = [&](size_t m) {
      const int p = G.members[m].update;
      return p >= it.first && p < it.first + it.count;
    };
    it.lo.assign(so, 0);
    it.hi.assign(so, 0);
    for (int j = 0; j < so; ++j) {
      const size_t c0 = j * cs, c1 = c0 + cs;
      size_t lo = c1, hi = c0;
      for (size_t m = 0; m < list.num_members(); ++m) {
        if (!in_item(m)) continue;
        const TensorListMember& mem = list.member(m);
        const size_t a = std::max(c0, mem.offset), b = std::min(c1, mem.end());
        if (a >= b) continue;
        lo = std::min(lo, a);
        hi = std::max(hi, b);
      }
      if (lo >= hi) lo = hi = c0;
      it.lo[j] = lo;
      it.hi[j] = hi;
      it.send_count = std::max(it.send_count, hi - lo);
    }
    slack[it.group] = std::max(slack[it.group], it.send_count);
    std::vector<Run1> runs;
    size_t covered = 0;
    for (int j = 0; j < so; ++j) {
      for (size_t m = 0; m < list.num_members(); ++m) {
        if (!in_item(m)) continue;
        const TensorListMember& mem = list.member(m);
        const MemberPiece& sp = G.members[m];
        const size_t a = std::max(it.lo[j], mem.offset),
                     b = std::min(it.hi[j], mem.offset + sp.valid);
        if (a >= b) continue;
        Run1 r{j * it.send_count + (a - it.lo[j]),
               G.logical_offset[sp.update] + sp.offset + (a - mem.offset) - it.logical_begin,
               b - a};
        covered += r.len;
        if (!runs.empty() && runs.back().src + runs.back().len == r.src &&
            runs.back().dst + runs.back().len == r.dst) {
          runs.back().len += r.len;
        } else {
          runs.push_back(r);
        }
      }
    }
    SSHSDP_CHECK(covered == it.numel, PlanError,
                 "full_tensor Muon: '{}' has {} elements but the buffer members of group {} "
                 "cover {}",
                 G.layout->update[it.first].name, it.numel, it.group, covered);
    it.zero_copy = runs.size() == 1 && runs[0].dst == 0;
    if (it.zero_copy) it.zero_copy_offset = runs[0].src;
    runs_.push_back(it.zero_copy ? std::vector<Run1>{} : std::move(runs));
  }

  // Buffer offsets (elements): send (per group: its ZeRO-1 chunk + slack for the largest
  // send count), gathered (per item: so · send_count), reassembled and v (per item: numel).
  for (size_t g = 0; g < groups_.size(); ++g) {
    send_offset_.push_back(send_elems_);
    send_elems_ += groups_[g].chain->LocalRange(Shard::kZero1).size() + slack[g];
  }
  for (size_t i = 0; i < items_.size(); ++i) {
    recv_offset_.push_back(recv_elems_);
    recv_elems_ += static_cast<size_t>(so) * items_[i].send_count;
    logical_offset_.push_back(logical_elems_);
    logical_elems_ += items_[i].numel;
  }
}

uint64_t FullTensorMuon::temporary_bytes() const {
  size_t asm_elems = 0;
  for (const GatherItem& it : items_)
    if (!it.zero_copy) asm_elems += it.numel;
  const size_t es = DTypeSize(cfg_.u_dtype);
  return (send_elems_ + recv_elems_ + asm_elems) * es + logical_elems_ * 4;
}

uint64_t FullTensorMuon::BytesSent() const {
  uint64_t b = 0;
  const size_t es = DTypeSize(cfg_.u_dtype);
  for (const GatherItem& it : items_) b += (comm_.size() - 1) * it.send_count * es;
  return b;
}

void FullTensorMuon::Run(const std::vector<Zero1State>& state, const ScalarState& scalars) {
  stats_ = {};
  const size_t es = DTypeSize(cfg_.u_dtype);
  const int me = comm_.rank();
  // Per group: which item each update parameter belongs to, and the state pointers.
  std::vector<std::vector<int>> item_of(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g)
    item_of[g].assign(groups_[g].layout->update.size(), -1);
  for (size_t i = 0; i < items_.size(); ++i)
    for (int p = items_[i].first; p < items_[i].first + items_[i].count; ++p)
      item_of[items_[i].group][p] = static_cast<int>(i);
  struct Ptrs {
    float *main = nullptr, *grad = nullptr, *m = nullptr;
  };
  std::vector<Ptrs> ptr(groups_.size());
  std::vector<bool> used(groups_.size(), false);
  for (const GatherItem& it : items_) used[it.group] = true;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!used[g]) continue;
    const size_t begin = groups_[g].chain->LocalRange(Shard::kZero1).begin;
    SSHSDP_CHECK(g < state.size() && state[g].chunk.begin == begin, PlanError,
                 "full_tensor Muon: ZeRO-1 state of group {} is missing or does not start at "
                 "element {}",
                 g, begin);
    auto field = [&](const char* name) {
      auto f = state[g].fields.find(name);
      SSHSDP_CHECK(f != state[g].fields.end() && f->second.data != nullptr && !f->second.packed,
                   PlanError, "full_tensor Muon: group {} provides no dense ZeRO-1 field '{}'", g,
                   name);
      return f->second.data;
    };
    ptr[g] = {field("main"), field("grad"), field("m")};
  }
  for (const UpdateStage& st : program_.stages)
    for (const std::string& s : st.scalars)
      SSHSDP_CHECK(scalars.Has(s), PlanError,
                   "full_tensor Muon: stage '{}' reads scalar '{}', "
                   "which is not set",
                   st.name, s);

  const uint64_t temp = temporary_bytes();
  if (account_) account_->Allocate(kUpdateTemporaries, temp);
  struct Free {
    MemoryAccount* a;
    uint64_t b;
    ~Free() {
      if (a) a->Free(kUpdateTemporaries, b);
    }
  } free_guard{account_, temp};
  size_t asm_elems = 0;
  std::vector<size_t> asm_offset(items_.size(), 0);
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].zero_copy) continue;
    asm_offset[i] = asm_elems;
    asm_elems += items_[i].numel;
  }
  std::vector<char> send(send_elems_ * es, 0);  // zeros: padding rows and slack
  std::unique_ptr<char[]> recv(new char[std::max<size_t>(recv_elems_ * es, 1)]);
  std::unique_ptr<char[]> assembled(new char[std::max<size_t>(asm_elems * es, 1)]);
  std::unique_ptr<float[]> v(new float[std::max<size_t>(logical_elems_, 1)]);

  // This rank's fragments of Muon parameters (valid elements only), for f0 and f2.
  struct Frag {
    int group = 0, item = 0;
    size_t shard_offset = 0, length = 0, logical = 0;  // logical: element within the item
  };
  std::vector<Frag> frags;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!used[g]) continue;
    const FullTensorGroup& G = groups_[g];
    for (const Fragment& f : G.chain->Fragments(Shard::kZero1)) {
      const MemberPiece& sp = G.members[f.member];
      const int i = item_of[g][sp.update];
      if (i < 0 || f.tensor_begin >= sp.valid) continue;
      frags.push_back(
          {static_cast<int>(g), i, f.shard_offset, std::min(f.length, sp.valid - f.tensor_begin),
           G.logical_offset[sp.update] + sp.offset + f.tensor_begin - items_[i].logical_begin});
    }
  }

  // f0: momentum and u on the local fragments, into the send buffer.
  {
    StageBatch b;
    b.stage = &program_.stages[0];
    b.scalars = &scalars;
    for (const Frag& f : frags) {
      StageItem it;
      it.begin = f.shard_offset;
      it.numel = static_cast<int64_t>(f.length);
      float* grad = ptr[f.group].grad + f.shard_offset;
      float* m = ptr[f.group].m + f.shard_offset;
      it.data = {grad, m, m, send.data() + (send_offset_[f.group] + f.shard_offset) * es};
      b.items.push_back(std::move(it));
    }
    if (!b.items.empty()) program_.stages[0].kernel(b);
  }

  // full_tensor(): one all-gather per item over the ZeRO-1 group.
  for (size_t i = 0; i < items_.size(); ++i) {
    const GatherItem& it = items_[i];
    const size_t chunk_begin = groups_[it.group].chain->LocalRange(Shard::kZero1).begin;
    const char* src = send.data() + (send_offset_[it.group] + (it.lo[me] - chunk_begin)) * es;
    comm_.AllGather(src, recv.get() + recv_offset_[i] * es, it.send_count, cfg_.u_dtype);
    stats_.bytes_sent += (comm_.size() - 1) * it.send_count * es;
    stats_.exchanges++;
  }

  // Reassembly (torch.cat of the pieces) where the gathered buffer is not the matrix.
  for (size_t i = 0; i < items_.size(); ++i) {
    for (const Run1& r : runs_[i]) {
      std::memcpy(assembled.get() + (asm_offset[i] + r.dst) * es,
                  recv.get() + (recv_offset_[i] + r.src) * es, r.len * es);
      stats_.bytes_copied += r.len * es;
    }
  }

  // f1: Newton–Schulz on every unit, batched by shape.
  {
    std::map<std::pair<int64_t, int64_t>, StageBatch> by_shape;
    for (size_t i = 0; i < items_.size(); ++i) {
      const GatherItem& it = items_[i];
      const char* base = it.zero_copy ? recv.get() + (recv_offset_[i] + it.zero_copy_offset) * es
                                      : assembled.get() + asm_offset[i] * es;
      for (int k : it.units) {
        const UpdateUnit& u = units_[k];
        StageBatch& b = by_shape[{u.rows, u.cols}];
        b.stage = &program_.stages[1];
        b.scalars = &scalars;
        b.rows = u.rows;
        b.cols = u.cols;
        const size_t off = u.begin - it.logical_begin;
        StageItem s;
        s.unit = &u;
        s.begin = u.begin;
        s.numel = static_cast<int64_t>(u.numel());
        s.data = {const_cast<char*>(base + off * es), v.get() + logical_offset_[i] + off};
        b.items.push_back(std::move(s));
      }
    }
    for (auto& [shape, b] : by_shape) {
      program_.stages[1].kernel(b);
      stats_.units_executed += b.items.size();
    }
  }

  // f2: the step on this rank's own fragments.
  {
    StageBatch b;
    b.stage = &program_.stages[2];
    b.scalars = &scalars;
    for (const Frag& f : frags) {
      StageItem it;
      it.begin = f.shard_offset;
      it.numel = static_cast<int64_t>(f.length);
      float* main = ptr[f.group].main + f.shard_offset;
      it.data = {main, v.get() + logical_offset_[f.item] + f.logical, main};
      b.items.push_back(std::move(it));
    }
    if (!b.items.empty()) program_.stages[2].kernel(b);
  }
  stats_.exec_cost = exec_cost_;
}

}  // namespace sshsdp
