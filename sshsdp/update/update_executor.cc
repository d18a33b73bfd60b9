// UpdateExecutor: update-scoped data trees, batched exchanges and kernel batches (see
// update_executor.h).
#include "sshsdp/update/update_executor.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

bool UsesField(const UpdateStage& s, const std::string& f) {
  for (const Operand& op : s.inputs)
    if (op.field == f) return true;
  for (const Operand& op : s.outputs)
    if (op.field == f) return true;
  return false;
}

}  // namespace

UpdateExecutor::UpdateExecutor(std::shared_ptr<const UpdatePlan> plan,
                               const std::vector<const ShardChain*>& chains, int rank,
                               Communicator* comm, Backend& backend, MemoryAccount* account)
    : plan_(std::move(plan)),
      rank_(rank),
      comm_(comm),
      account_(account),
      backend_(backend),
      on_device_(!backend.host_memory()) {
  const UpdateProgram& prog = plan_->program();
  const std::vector<UpdateUnit>& units = plan_->units();
  const std::vector<UnitPlacement>& place = plan_->placements();
  for (const ShardChain* c : chains) z1_begin_.push_back(c->LocalRange(Shard::kZero1).begin);

  // The exchange communicator is ordered like the topology: position = rank.
  const Topology& topo = chains.front()->topology();
  SSHSDP_CHECK(!comm_ || (comm_->size() == topo.world() && comm_->rank() == rank_), LayoutError,
               "update '{}': communicator {} has {} ranks (this one at {}), but the layout {} "
               "needs one ordered like its {} ranks with this rank at {}; pass the world "
               "communicator or a duplicate",
               prog.name, comm_->name(), comm_->size(), comm_->rank(), topo.ToString(),
               topo.world(), rank_);

  // Update-scoped roots: temporaries (whole-unit views where a unit stage needs them) and
  // scratch for state operands of split units executed here.
  const size_t nf = prog.fields.size();
  whole_.assign(nf, std::vector<DataNode*>(units.size(), nullptr));
  piece_ = whole_;
  scratch_ = whole_;
  for (size_t f = 0; f < nf; ++f) {
    const FieldDecl& fd = prog.fields[f];
    bool in_unit_stage = false;
    for (size_t s = 0; s < prog.stages.size(); ++s)
      if (plan_->stage_kinds()[s] == StageKind::kUnit && UsesField(prog.stages[s], fd.name))
        in_unit_stage = true;
    const bool temp = fd.role == FieldRole::kTemporary;
    if (!temp && !in_unit_stage) continue;
    auto root = std::make_unique<DataNode>(
        fmt::format("update.{}.{}{}", prog.name, temp ? "" : "scratch.", fd.name));
    for (size_t i = 0; i < units.size(); ++i) {
      const UpdateUnit& u = units[i];
      const bool exec = place[i].exec_rank == rank_;
      if (temp) {
        if (in_unit_stage && exec) {
          whole_[f][i] = &root->AddChild(u.name, fd.dtype, {u.rows, u.cols}, DataNode::kAuto,
                                         DataNode::kRootAlignment);
        } else if (const UnitPiece* pc = MyPiece(static_cast<int>(i))) {
          piece_[f][i] = &root->AddChild(fmt::format("{}@{}", u.name, pc->begin - u.begin),
                                         fd.dtype, {static_cast<int64_t>(pc->length)});
        }
      } else if (exec && place[i].split()) {
        scratch_[f][i] = &root->AddChild(u.name, fd.dtype, {u.rows, u.cols}, DataNode::kAuto,
                                         DataNode::kRootAlignment);
      }
    }
    if (root->children().empty()) continue;
    root->Finalize();
    roots_.push_back(std::move(root));
  }

  // Per-stage work lists.
  for (size_t s = 0; s < prog.stages.size(); ++s) {
    const UpdateStage& st = prog.stages[s];
    StagePlan sp;
    sp.kind = plan_->stage_kinds()[s];
    std::vector<int> op_fields;
    for (const std::vector<Operand>* ops : {&st.inputs, &st.outputs})
      for (const Operand& op : *ops)
        op_fields.push_back(static_cast<int>(prog.Field(op.field) - prog.fields.data()));
    std::map<std::pair<int64_t, int64_t>, size_t> shape_index;
    for (size_t i = 0; i < units.size(); ++i) {
      const int ui = static_cast<int>(i);
      const UpdateUnit& u = units[i];
      ItemPlan item;
      item.unit = ui;
      if (sp.kind == StageKind::kElementwise) {
        const UnitPiece* pc = MyPiece(ui);
        if (!pc) continue;
        item.begin = pc->begin;
        item.numel = static_cast<int64_t>(pc->length);
        for (int f : op_fields) item.locs.push_back(PieceLoc(f, ui));
      } else {
        if (place[i].exec_rank != rank_) continue;
        item.begin = u.begin;
        item.numel = static_cast<int64_t>(u.numel());
        for (int f : op_fields) item.locs.push_back(UnitLoc(f, ui));
        auto key = std::make_pair(u.rows, u.cols);
        auto it = shape_index.find(key);
        if (it == shape_index.end()) {
          it = shape_index.emplace(key, sp.by_shape.size()).first;
          sp.by_shape.emplace_back();
        }
        sp.by_shape[it->second].push_back(sp.items.size());
        // This rank's own piece of a state operand of a split unit goes through scratch.
        if (place[i].split()) {
          const UnitPiece* pc = MyPiece(ui);
          auto copies = [&](const std::vector<Operand>& ops, bool in) {
            for (const Operand& op : ops) {
              const int f = static_cast<int>(prog.Field(op.field) - prog.fields.data());
              if (prog.fields[f].role != FieldRole::kState) continue;
              Loc whole = UnitLoc(f, ui);
              whole.byte_offset += (pc->begin - u.begin) * 4;
              Copy c{in ? PieceLoc(f, ui) : whole, in ? whole : PieceLoc(f, ui), pc->length * 4};
              (in ? sp.copy_in : sp.copy_out).push_back(c);
            }
          };
          copies(st.inputs, true);
          copies(st.outputs, false);
        }
      }
      sp.items.push_back(std::move(item));
    }
    for (const PlannedMessage& m : plan_->messages()) {
      if (m.stage != static_cast<int>(s) || (m.src != rank_ && m.dst != rank_)) continue;
      const int f = static_cast<int>(prog.Field(m.field) - prog.fields.data());
      const UpdateUnit& u = units[m.unit];
      Loc whole = UnitLoc(f, m.unit);
      whole.byte_offset += (m.begin - u.begin) * DTypeSize(prog.fields[f].dtype);
      const bool fetch = m.kind == PlannedMessage::Kind::kFetch;
      if (m.src == rank_) {
        Xfer x{m.dst, fetch ? PieceLoc(f, m.unit) : whole, m.bytes};
        (fetch ? sp.fetch_send : sp.return_send).push_back(x);
      } else {
        Xfer x{m.src, fetch ? whole : PieceLoc(f, m.unit), m.bytes};
        (fetch ? sp.fetch_recv : sp.return_recv).push_back(x);
      }
    }
    stages_.push_back(std::move(sp));
  }
}

UpdateExecutor::~UpdateExecutor() {
  for (auto& r : roots_) r->Release();
  if (device_blocks_.empty()) return;
  for (void* p : device_blocks_)
    if (p) backend_.Free(p);
  if (account_) account_->Free(kUpdateTemporaries, temporary_bytes());
}

const UnitPiece* UpdateExecutor::MyPiece(int unit) const {
  for (const UnitPiece& pc : plan_->placements()[unit].pieces)
    if (pc.rank == rank_) return &pc;
  return nullptr;
}

UpdateExecutor::Loc UpdateExecutor::PieceLoc(int field, int unit) const {
  const UpdateUnit& u = plan_->units()[unit];
  const UnitPiece* pc = MyPiece(unit);
  SSHSDP_CHECK(pc != nullptr, PlanError, "update '{}': rank {} holds no piece of unit '{}'",
               plan_->program().name, rank_, u.name);
  const FieldDecl& fd = plan_->program().fields[field];
  Loc loc;
  loc.group = u.group;
  loc.field = field;
  if (fd.role == FieldRole::kState) {
    loc.byte_offset = (pc->begin - z1_begin_[u.group]) * 4;
  } else if (DataNode* w = whole_[field][unit]) {
    loc.node = w;
    loc.byte_offset = (pc->begin - u.begin) * DTypeSize(fd.dtype);
  } else {
    loc.node = piece_[field][unit];
  }
  return loc;
}

UpdateExecutor::Loc UpdateExecutor::UnitLoc(int field, int unit) const {
  const UpdateUnit& u = plan_->units()[unit];
  const FieldDecl& fd = plan_->program().fields[field];
  Loc loc;
  loc.group = u.group;
  loc.field = field;
  if (fd.role == FieldRole::kTemporary) {
    loc.node = whole_[field][unit];
  } else if (plan_->placements()[unit].split()) {
    loc.node = scratch_[field][unit];
  } else {
    loc.byte_offset = (u.begin - z1_begin_[u.group]) * 4;
  }
  return loc;
}

size_t Zero1Array::Index(size_t i) const {
  if (!packed) return i;
  auto it = std::upper_bound(runs.begin(), runs.end(), i,
                             [](size_t e, const PackedRun& r) { return e < r.begin; });
  if (it == runs.begin() || i >= (--it)->end) return kNotStored;
  return it->offset + (i - it->begin);
}

float* Zero1Array::At(size_t i) const {
  const size_t k = Index(i);
  return k == kNotStored ? nullptr : data + k;
}

size_t Zero1Array::stored() const {
  size_t n = 0;
  for (const PackedRun& r : runs) n += r.end - r.begin;
  return n;
}

void* UpdateExecutor::Ptr(const Loc& loc) const {
  if (loc.node) return static_cast<char*>(loc.node->data()) + loc.byte_offset;
  const Zero1Array& a = *state_ptr_[loc.group][loc.field];
  float* p = a.At(loc.byte_offset / 4);
  SSHSDP_CHECK(p != nullptr, PlanError,
               "update '{}': group {} stores no ZeRO-1 field '{}' at chunk element {} (a packed "
               "field of another optimizer's parameters)",
               plan_->program().name, loc.group, plan_->program().fields[loc.field].name,
               loc.byte_offset / 4);
  return p;
}

uint64_t UpdateExecutor::temporary_bytes() const {
  uint64_t b = 0;
  for (const auto& r : roots_) b += r->bytes();
  return b;
}

void UpdateExecutor::Exchange(const std::vector<Xfer>& sends, const std::vector<Xfer>& recvs,
                              int tag) {
  if (sends.empty() && recvs.empty()) return;
  std::vector<P2POp> s, r;
  for (const Xfer& x : sends) {
    s.push_back({x.peer, Ptr(x.loc), x.bytes, tag});
    stats_.bytes_sent += x.bytes;
  }
  for (const Xfer& x : recvs) r.push_back({x.peer, Ptr(x.loc), x.bytes, tag});
  if (on_device_) {
    // Staged: the communicator moves host memory only. One host buffer per direction.
    size_t send_bytes = 0, recv_bytes = 0;
    for (const P2POp& op : s) send_bytes += op.bytes;
    for (const P2POp& op : r) recv_bytes += op.bytes;
    std::vector<uint8_t> out(send_bytes), in(recv_bytes);
    size_t at = 0;
    for (P2POp& op : s) {
      if (op.bytes) backend_.CopyOut(out.data() + at, op.data, op.bytes);
      op.data = out.data() + at;
      at += op.bytes;
    }
    std::vector<void*> dst;
    at = 0;
    for (P2POp& op : r) {
      dst.push_back(op.data);
      op.data = in.data() + at;
      at += op.bytes;
    }
    comm_->Exchange(s, r);
    for (size_t i = 0; i < r.size(); ++i)
      if (r[i].bytes) backend_.CopyIn(dst[i], r[i].data, r[i].bytes);
  } else {
    comm_->Exchange(s, r);
  }
  stats_.exchanges++;
}

void UpdateExecutor::CopyBytes(const Copy& c) {
  backend_.Copy(Ptr(c.to), Ptr(c.from), c.bytes);
  stats_.bytes_copied += c.bytes;
}

void UpdateExecutor::AllocateRoots() {
  if (!on_device_) {
    for (auto& r : roots_) r->Allocate(account_, kUpdateTemporaries);
    return;
  }
  // Device memory is allocated at the first Run and kept until the executor goes (an
  // allocation and a free per step would synchronize the device each time), and accounted for
  // all that time: it is held through forward and backward too.
  if (device_blocks_.empty() && !roots_.empty()) {
    std::vector<void*> blocks;
    try {
      for (auto& r : roots_) blocks.push_back(r->bytes() ? backend_.Alloc(r->bytes()) : nullptr);
    } catch (...) {
      for (void* p : blocks)
        if (p) backend_.Free(p);
      throw;
    }
    device_blocks_ = std::move(blocks);
    if (account_) account_->Allocate(kUpdateTemporaries, temporary_bytes());
  }
  for (size_t i = 0; i < roots_.size(); ++i)
    if (device_blocks_[i]) roots_[i]->AttachExternal(device_blocks_[i], roots_[i]->bytes());
}

void UpdateExecutor::ReleaseRoots() {
  for (auto& r : roots_) r->Release();  // host roots free (and unaccount) their memory
}

void UpdateExecutor::Run(const std::vector<Zero1State>& state, const ScalarState& scalars) {
  const UpdateProgram& prog = plan_->program();
  SSHSDP_CHECK(comm_ != nullptr, PlanError,
               "update '{}': this executor was built for a plan (no communicator); it cannot run",
               prog.name);
  stats_ = {};
  // Resolve the state pointers of every group that has units.
  state_ptr_.assign(z1_begin_.size(), std::vector<const Zero1Array*>(prog.fields.size(), nullptr));
  std::vector<bool> used(z1_begin_.size(), false);
  for (const UpdateUnit& u : plan_->units()) used[u.group] = true;
  for (size_t g = 0; g < used.size(); ++g) {
    if (!used[g]) continue;
    SSHSDP_CHECK(g < state.size() && state[g].chunk.begin == z1_begin_[g], PlanError,
                 "update '{}': ZeRO-1 state of group {} is missing or does not start at element "
                 "{}",
                 prog.name, g, z1_begin_[g]);
    for (size_t f = 0; f < prog.fields.size(); ++f) {
      if (prog.fields[f].role != FieldRole::kState) continue;
      auto it = state[g].fields.find(prog.fields[f].name);
      SSHSDP_CHECK(it != state[g].fields.end() && it->second.data != nullptr, PlanError,
                   "update '{}': group {} provides no ZeRO-1 field '{}'", prog.name, g,
                   prog.fields[f].name);
      state_ptr_[g][f] = &it->second;
    }
  }
  for (const UpdateStage& st : prog.stages)
    for (const std::string& s : st.scalars)
      SSHSDP_CHECK(scalars.Has(s), PlanError,
                   "update '{}', stage '{}' reads scalar '{}', which is not set", prog.name,
                   st.name, s);

  struct Guard {
    UpdateExecutor* ex;
    ~Guard() { ex->ReleaseRoots(); }
  } guard{this};
  AllocateRoots();

  for (size_t s = 0; s < prog.stages.size(); ++s) {
    const UpdateStage& st = prog.stages[s];
    const StagePlan& sp = stages_[s];
    auto item_of = [&](const ItemPlan& ip) {
      StageItem it;
      it.unit = &plan_->units()[ip.unit];
      it.begin = ip.begin;
      it.numel = ip.numel;
      it.data.reserve(ip.locs.size());
      for (const Loc& l : ip.locs) it.data.push_back(Ptr(l));
      return it;
    };
    if (sp.kind == StageKind::kElementwise) {
      if (sp.items.empty()) continue;
      StageBatch b;
      b.stage = &st;
      b.scalars = &scalars;
      b.items.reserve(sp.items.size());
      for (const ItemPlan& ip : sp.items) b.items.push_back(item_of(ip));
      st.kernel(b);
      continue;
    }
    Exchange(sp.fetch_send, sp.fetch_recv, static_cast<int>(2 * s));
    for (const Copy& c : sp.copy_in) CopyBytes(c);
    for (const std::vector<size_t>& idx : sp.by_shape) {
      StageBatch b;
      b.stage = &st;
      b.scalars = &scalars;
      const UpdateUnit& u0 = plan_->units()[sp.items[idx.front()].unit];
      b.rows = u0.rows;
      b.cols = u0.cols;
      for (size_t k : idx) b.items.push_back(item_of(sp.items[k]));
      st.kernel(b);
      stats_.units_executed += idx.size();
    }
    for (const Copy& c : sp.copy_out) CopyBytes(c);
    Exchange(sp.return_send, sp.return_recv, static_cast<int>(2 * s + 1));
  }
  stats_.exec_cost = plan_->ExecCost(rank_);
}

}  // namespace sshsdp
