// Update parameters, runtime parameters and the per-group flat layout that binds them.
//
// A runtime group (one layer) declares runtime parameters P′ (what kernels consume: the
// packed QKV projection, an MLP matrix, a norm gain), each made of update parameters P
// (what the optimizer updates: one head's Q matrix, a whole matrix, a gain) — paper §3.1.
// GroupLayout packs every update parameter of the group, in runtime order, into ONE tensor
// list, so each runtime parameter is a contiguous run of members: its weight w′ and gradient
// g′ are views over the update params' storage (Tw/Tg are view-only, zero copy).
// All fields (runtime weight w, fp32 main, fp32 grad, optimizer state) share this element
// layout, each in its own buffer and dtype, so the shard chain of one list serves them all.
//
// Parameters with different optimizer-state schemas (the paper's separate atoms: AdamW keeps
// m and v, Muon only m) share this element layout for the fields they have in common; a field
// only some parameters have is stored packed over their fragments (update_executor.h,
// Zero1Array), so no optimizer pays for another's state.
//
//   GroupLayout L = BuildGroupLayout(/*group=*/1, model.GroupParams(1), DType::kBF16, so);
//   const RuntimeParam& qkv = L.runtime[1];          // members [first, first+count)
//   L.list.member(qkv.first_member).offset;          // == qkv.offset
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "sshsdp/layout/shard_chain.h"
#include "sshsdp/layout/tensor_list.h"
#include "sshsdp/params/model.h"

namespace sshsdp {

// Which optimizer updates a parameter.
enum class OptimizerKind { kAdamW, kMuon };
const char* OptimizerName(OptimizerKind k);

// A member of a buffer's tensor list as a piece of one update parameter: elements
// [offset, offset + valid) of update parameter `update`; the rest of the member, if any, is
// padding that stays zero (dim-0 shards). The sshsdp flat layout is the identity: member m
// is all of update parameter m.
struct MemberPiece {
  int update = 0;
  size_t offset = 0;
  size_t valid = 0;
};

// The update-parameter elements a shard fragment holds: `length` elements of update
// parameter `update` from element `begin`, stored from `shard_offset` of the shard. length 0:
// the fragment is dim-0 padding only. The one mapping from buffer fragments to update
// parameters (init, load, gather, checkpoints all use it).
struct FragmentSpan {
  int update = 0;
  size_t begin = 0;
  size_t length = 0;
  size_t shard_offset = 0;
  size_t end() const { return begin + length; }
};
inline FragmentSpan SpanOf(const std::vector<MemberPiece>& pieces, const Fragment& f) {
  const MemberPiece& pc = pieces.at(static_cast<size_t>(f.member));
  if (f.tensor_begin >= pc.valid) return {pc.update, pc.offset + pc.valid, 0, f.shard_offset};
  return {pc.update, pc.offset + f.tensor_begin, std::min(f.length, pc.valid - f.tensor_begin),
          f.shard_offset};
}

struct UpdateParam {
  std::string name;
  std::vector<int64_t> shape;
  UpdateKind kind = UpdateKind::kMatrix;
  InitSpec init;
  bool muon_eligible = true;  // UpdatePart::muon_eligible (see MuonEligible in model.h)
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  int group = 0;
  int member = 0;   // index in the group's tensor list
  int runtime = 0;  // index of the runtime parameter it belongs to
};

struct RuntimeParam {
  std::string name;
  std::vector<int64_t> shape;
  int first_member = 0;
  int num_members = 0;
  size_t offset = 0;  // first element in the group's flat list
  size_t numel = 0;
};

struct GroupLayout {
  int group = 0;
  std::vector<RuntimeParam> runtime;
  std::vector<UpdateParam> update;  // indexed like the tensor list's members
  TensorList list;
};

// Validates every spec (PlanError naming the parameter) and packs the group. `pad_multiple`
// is the ZeRO-1 degree so every level's chunks are equal.
GroupLayout BuildGroupLayout(int group, const std::vector<RuntimeParamSpec>& specs,
                             DType runtime_dtype, size_t pad_multiple);

}  // namespace sshsdp
