// UpdatePlan construction: unit pieces, execution ranks, messages (see update_plan.h).
#include "sshsdp/update/update_plan.h"

#include <algorithm>
#include <map>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

// Pieces of `u` per ZeRO-1 chunk, from the shard chain's ownership lookup of every member the
// unit touches (adjacent member pieces in one chunk are merged: they are contiguous).
std::vector<UnitPiece> PiecesOf(const UpdateUnit& u, const ShardChain& chain, int replica) {
  const TensorList& list = chain.list();
  std::vector<UnitPiece> out;
  for (int m = u.first_member; m < u.first_member + u.num_members; ++m) {
    const TensorListMember& mem = list.member(static_cast<size_t>(m));
    const size_t a = std::max(u.begin, mem.offset), b = std::min(u.end(), mem.end());
    if (a >= b) continue;
    for (const OwnedFragment& o : chain.Zero1Owners(m, a - mem.offset, b - mem.offset, replica)) {
      const size_t begin = mem.offset + o.fragment.tensor_begin;
      if (!out.empty() && out.back().chunk == o.zero1_chunk &&
          out.back().begin + out.back().length == begin) {
        out.back().length += o.fragment.length;
      } else {
        out.push_back({o.rank, o.zero1_chunk, begin, o.fragment.length});
      }
    }
  }
  return out;
}

}  // namespace

UpdatePlan::UpdatePlan(UpdateProgram program, std::vector<UpdateUnit> units,
                       const std::vector<const ShardChain*>& chains, int replica)
    : program_(std::move(program)), units_(std::move(units)), replica_(replica) {
  kinds_ = ValidateProgram(program_, units_);
  SSHSDP_CHECK(!chains.empty(), LayoutError, "update plan '{}': no shard chains", program_.name);
  const Topology& topo = chains[0]->topology();
  SSHSDP_CHECK(replica >= 0 && replica < topo.num_replicas(), LayoutError,
               "update plan '{}': replica {} outside the {} HSDP replicas of {}", program_.name,
               replica, topo.num_replicas(), topo.ToString());
  for (int j = 0; j < topo.so(); ++j) ranks_.push_back(topo.Zero1ChunkOwner(j, replica));
  std::sort(ranks_.begin(), ranks_.end());

  // Pieces and costs.
  placements_.resize(units_.size());
  for (size_t i = 0; i < units_.size(); ++i) {
    const UpdateUnit& u = units_[i];
    SSHSDP_CHECK(u.group >= 0 && static_cast<size_t>(u.group) < chains.size(), LayoutError,
                 "update plan '{}': unit '{}' names group {} but only {} shard chains were given",
                 program_.name, u.name, u.group, chains.size());
    const TensorList& list = chains[u.group]->list();
    SSHSDP_CHECK(u.num_members >= 1 && u.first_member >= 0 &&
                     static_cast<size_t>(u.first_member + u.num_members) <= list.num_members() &&
                     u.begin >= list.member(u.first_member).offset &&
                     u.end() <= list.member(u.first_member + u.num_members - 1).end(),
                 LayoutError,
                 "update plan '{}': unit '{}' [{}, {}) is not inside members [{}, {}) of '{}'",
                 program_.name, u.name, u.begin, u.end(), u.first_member,
                 u.first_member + u.num_members, list.name());
    UnitPlacement& p = placements_[i];
    p.pieces = PiecesOf(u, *chains[u.group], replica);
    size_t covered = 0;
    for (const UnitPiece& pc : p.pieces) covered += pc.length;
    SSHSDP_CHECK(covered == u.numel(), LayoutError,
                 "update plan '{}': unit '{}' has {} elements but its members cover {} (units "
                 "spanning several members need them back to back)",
                 program_.name, u.name, u.numel(), covered);
    for (size_t s = 0; s < program_.stages.size(); ++s) {
      if (kinds_[s] != StageKind::kUnit) continue;
      const UpdateStage& st = program_.stages[s];
      p.cost += st.cost ? st.cost(u) : static_cast<double>(u.numel());
    }
  }

  // Execution ranks: local units first, then split units by decreasing cost on the least
  // loaded owner (ties: most elements, then the first element's owner).
  std::map<int, double> load;
  for (int r : ranks_) load[r] = 0;
  std::vector<size_t> split;
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitPlacement& p = placements_[i];
    if (p.split()) {
      split.push_back(i);
    } else {
      p.exec_rank = p.pieces.front().rank;
      load[p.exec_rank] += p.cost;
    }
  }
  std::stable_sort(split.begin(), split.end(),
                   [&](size_t a, size_t b) { return placements_[a].cost > placements_[b].cost; });
  for (size_t i : split) {
    UnitPlacement& p = placements_[i];
    const UnitPiece* best = &p.pieces.front();
    for (const UnitPiece& pc : p.pieces) {
      const double lb = load[best->rank], lc = load[pc.rank];
      if (lc < lb || (lc == lb && pc.length > best->length)) best = &pc;
    }
    p.exec_rank = best->rank;
    load[p.exec_rank] += p.cost;
  }

  // Messages, stage by stage: fetches (inputs, owner → exec) then returns (outputs).
  for (size_t s = 0; s < program_.stages.size(); ++s) {
    if (kinds_[s] != StageKind::kUnit) continue;
    const UpdateStage& st = program_.stages[s];
    for (PlannedMessage::Kind kind :
         {PlannedMessage::Kind::kFetch, PlannedMessage::Kind::kReturn}) {
      const std::vector<Operand>& ops =
          kind == PlannedMessage::Kind::kFetch ? st.inputs : st.outputs;
      for (size_t i = 0; i < units_.size(); ++i) {
        const UnitPlacement& p = placements_[i];
        if (!p.split()) continue;
        for (const Operand& op : ops) {
          const size_t es = DTypeSize(program_.Field(op.field)->dtype);
          for (const UnitPiece& pc : p.pieces) {
            if (pc.rank == p.exec_rank) continue;
            PlannedMessage m;
            m.kind = kind;
            m.stage = static_cast<int>(s);
            m.field = op.field;
            m.unit = static_cast<int>(i);
            m.src = kind == PlannedMessage::Kind::kFetch ? pc.rank : p.exec_rank;
            m.dst = kind == PlannedMessage::Kind::kFetch ? p.exec_rank : pc.rank;
            m.begin = pc.begin;
            m.length = pc.length;
            m.bytes = pc.length * es;
            messages_.push_back(std::move(m));
          }
        }
      }
    }
  }
}

double UpdatePlan::ExecCost(int rank) const {
  double c = 0;
  for (const UnitPlacement& p : placements_)
    if (p.exec_rank == rank) c += p.cost;
  return c;
}

uint64_t UpdatePlan::BytesSent(int rank) const {
  uint64_t b = 0;
  for (const PlannedMessage& m : messages_)
    if (m.src == rank) b += m.bytes;
  return b;
}

int UpdatePlan::num_split() const {
  return static_cast<int>(std::count_if(placements_.begin(), placements_.end(),
                                        [](const UnitPlacement& p) { return p.split(); }));
}

std::string UpdatePlan::Describe() const {
  std::string s =
      fmt::format("update plan '{}' (replica {}): {} units, {} split, {} messages\n", program_.name,
                  replica_, units_.size(), num_split(), messages_.size());
  for (size_t i = 0; i < units_.size(); ++i) {
    const UnitPlacement& p = placements_[i];
    if (!p.split()) continue;
    std::string owners;
    for (const UnitPiece& pc : p.pieces)
      owners += fmt::format(" rank {} [{}, {})", pc.rank, pc.begin - units_[i].begin,
                            pc.begin - units_[i].begin + pc.length);
    s += fmt::format("  unit '{}' [{}, {}]:{} -> executes on rank {}\n", units_[i].name,
                     units_[i].rows, units_[i].cols, owners, p.exec_rank);
  }
  for (const PlannedMessage& m : messages_) {
    const UpdateUnit& u = units_[m.unit];
    s += fmt::format("  {} {} '{}' {}[{}, {}): rank {} -> rank {}, {} bytes\n",
                     program_.stages[m.stage].name,
                     m.kind == PlannedMessage::Kind::kFetch ? "fetch" : "return", u.name, m.field,
                     m.begin - u.begin, m.begin - u.begin + m.length, m.src, m.dst, m.bytes);
  }
  return s;
}

}  // namespace sshsdp
