// sshsdp's data path (views of the flat buffers, fused accumulation) and the transient pool
// (see engine_internal.h).
#include "sshsdp/base/error.h"
#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/engine/mx_weights.h"

namespace sshsdp {

std::vector<TensorRef> RuntimeGroup::Views(const DataNode& root, DType dt) const {
  std::vector<TensorRef> out;
  for (const auto& c : root.children()) out.push_back(TensorRef{c->data(), dt});
  return out;
}

TransientPool::~TransientPool() {
  for (auto& [p, bytes] : all_) {
    if (!dry_) backend_->Free(p);  // a dry pool's placeholders were never allocated
    memory_->Free("transient", bytes);
  }
}

void* TransientPool::Acquire(size_t bytes) {
  // Best fit: the smallest free block that holds `bytes` (blocks of the largest layer serve
  // every smaller one).
  auto it = free_.lower_bound(bytes);
  if (it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    return p;
  }
  constexpr size_t a = DataNode::kRootAlignment;
  void* p = dry_ ? reinterpret_cast<void*>(a * (all_.size() + 1))  // never dereferenced
                 : backend_->Alloc(RoundUp(bytes, a));
  SSHSDP_CHECK(p != nullptr, Error, "out of memory allocating a {}-byte transient buffer", bytes);
  all_.emplace_back(p, bytes);
  memory_->Allocate("transient", bytes);
  return p;
}

void TransientPool::Recycle(void* p) {
  for (const auto& [q, capacity] : all_) {
    if (q == p) {
      free_.emplace(capacity, p);
      return;
    }
  }
  throw Error("TransientPool::Recycle: block was not acquired from the pool");
}

std::function<void()> DataPath::GatherTask(RuntimeGroup& g, Communicator* zero3) {
  const void* src = g.w_z3->data();
  void* dst = g.gather_block;
  const size_t count = g.z3.size();
  const DType dt = g.wdt;
  return [=] { zero3->AllGather(src, dst, count, dt); };
}

std::vector<TensorRef> DataPath::Weights(RuntimeGroup& g) {
  std::vector<TensorRef> v = g.Views(*g.w_full, g.wdt);
  if (g.wdt == DType::kE4M3)
    for (size_t r = 0; r < v.size(); ++r) {
      v[r].scales = c_.mx->scales(g.layout.group, static_cast<int>(r));
      v[r].scale_layout = c_.cfg->scale_layout;
    }
  return v;
}

std::vector<TensorRef> DataPath::GradTargets(RuntimeGroup& g) {
  if (g.grad_block) {  // a transient G′: backward overwrites the members, not the tail
    const size_t gs = DTypeSize(c_.grad_dtype);
    const size_t used = g.layout.list.numel();
    c_.backend->Zero(static_cast<char*>(g.grad_block) + used * gs, (g.padded - used) * gs);
  }
  return g.Views(*g.g_full, c_.grad_dtype);
}

std::function<void()> DataPath::ReduceTask(RuntimeGroup& g, Communicator* zero2, bool accumulate,
                                           const ReduceScatterOptions& ro) {
  if (accumulate) c_.counters->fused_accumulations++;
  const void* src = g.grad_block;
  void* dst = g.g_z2->data();
  const size_t count = g.z2.size();
  const DType gdt = c_.grad_dtype;
  return [=] { zero2->ReduceScatterPartials(src, gdt, dst, DType::kF32, count, accumulate, ro); };
}

std::unique_ptr<DataPath> MakeDataPath(const DataPathContext& c) {
  const Redundancies& R = c.cfg->redundancies;
  const bool plain = c.cfg->shard_layout == ShardLayout::kFlat && !R.tw_every_use &&
                     !R.cast_every_gather && !R.weight_copies && !R.grad_copies && !R.separate_add;
  return plain ? std::make_unique<DataPath>(c) : MakeRedundantPath(c);
}

}  // namespace sshsdp
