// Baseline switches: shard layouts of the baselines, the counted copy helper (redundancy.h).
#include "sshsdp/engine/redundancy.h"

#include <algorithm>
#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/layout/data_node.h"

namespace sshsdp {

const char* ShardLayoutName(ShardLayout l) {
  switch (l) {
    case ShardLayout::kFlat:
      return "flat";
    case ShardLayout::kDim0:
      return "dim0";
    case ShardLayout::kAligned:
      return "aligned";
  }
  return "?";
}

std::string Redundancies::ToString() const {
  std::string s;
  if (tw_every_use) s += "①";
  if (cast_every_gather) s += "②";
  if (weight_copies) s += "③";
  if (grad_copies) s += "④";
  if (separate_add) s += "⑤";
  if (structured_updates != StructuredUpdates::kUnits) s += "⑥";
  if (replicate_optimizer) s += "⑦";
  return s.empty() ? "none" : s;
}

void CheckStructuredUpdates(const Redundancies& r, const std::string& optimizer,
                            const std::string& first_param) {
  SSHSDP_CHECK(r.structured_updates != StructuredUpdates::kUnsupported, ConfigError,
               "optimizer '{}' updates '{}' as a structured (matrix) unit, but this configuration "
               "has no structured updates (the megatron-fsdp preset: flat buffers split heads "
               "and matrices across ranks and nothing reassembles them); use AdamW, or the "
               "sshsdp / vescale-fsdp / fsdp2 presets",
               optimizer, first_param);
}

namespace {

std::vector<std::pair<size_t, size_t>> Uncovered(const TensorList& list,
                                                 const std::vector<MemberPiece>& pieces) {
  std::vector<std::pair<size_t, size_t>> out;
  auto add = [&](size_t a, size_t b) {  // merges adjacent ranges
    if (b <= a) return;
    if (!out.empty() && out.back().second == a) {
      out.back().second = b;
    } else {
      out.emplace_back(a, b);
    }
  };
  size_t at = 0;
  for (size_t m = 0; m < list.num_members(); ++m) {
    const TensorListMember& mem = list.member(m);
    add(at, mem.offset);
    add(mem.offset + pieces[m].valid, mem.end());
    at = mem.end();
  }
  add(at, list.padded_numel());
  return out;
}

}  // namespace

EngineLayout BuildEngineLayout(ShardLayout kind, int group,
                               const std::vector<RuntimeParamSpec>& specs, DType runtime_dtype,
                               int sw, int so) {
  EngineLayout E;
  // Validation, update and runtime parameters are those of the flat layout in every case.
  E.layout = BuildGroupLayout(group, specs, runtime_dtype, static_cast<size_t>(so));
  GroupLayout& L = E.layout;
  const size_t n_update = L.update.size();
  if (kind == ShardLayout::kFlat) {
    for (size_t m = 0; m < n_update; ++m)
      E.pieces.push_back({static_cast<int>(m), 0, L.list.member(m).numel});
  } else if (kind == ShardLayout::kAligned) {
    // Ragged shards emulated by padding: a member that fits in one ZeRO-1 chunk but would
    // straddle a boundary starts at the next boundary. The chunk size grows until the
    // aligned members fit in so chunks.
    size_t chunk = (L.list.numel() + so - 1) / so;
    for (;;) {
      size_t end = 0;
      for (size_t m = 0; m < n_update; ++m) {
        const size_t n = L.list.member(m).numel;
        size_t off = end;
        if (n <= chunk && off / chunk != (off + n - 1) / chunk) off = RoundUp(off, chunk);
        end = off + n;
      }
      if (end <= chunk * so) break;
      chunk = (end + so - 1) / so;
    }
    TensorList list(L.list.name(), runtime_dtype);
    size_t end = 0;
    for (size_t m = 0; m < n_update; ++m) {
      const TensorListMember& mem = L.list.member(m);
      size_t align = 1;
      if (mem.numel <= chunk && end / chunk != (end + mem.numel - 1) / chunk) align = chunk;
      int idx = list.Add(mem.name, mem.shape, align);
      end = list.member(idx).end();
      E.pieces.push_back({static_cast<int>(m), 0, mem.numel});
    }
    list.Finalize(chunk * so);
    L.list = std::move(list);
    for (RuntimeParam& rp : L.runtime) rp.offset = L.list.member(rp.first_member).offset;
  } else {
    // FSDP2: per-parameter dim-0 shards, torch.chunk semantics (rank r holds rows
    // [r·c, min(R, (r+1)·c)) with c = ceil(R / sw), padded to c rows), rank-major.
    const size_t sub = static_cast<size_t>(so / sw);  // ZeRO-1 chunks per ZeRO-3 chunk
    size_t block = 0;
    for (const UpdateParam& u : L.update) {
      const size_t rows = static_cast<size_t>(u.shape[0]);
      block += (rows + sw - 1) / sw * (NumElements(u.shape) / rows);
    }
    const size_t block_pad = RoundUp(block, sub);
    TensorList list(L.list.name(), runtime_dtype);
    for (int r = 0; r < sw; ++r) {
      for (size_t p = 0; p < n_update; ++p) {
        UpdateParam& u = L.update[p];
        const size_t rows = static_cast<size_t>(u.shape[0]);
        const size_t cols = NumElements(u.shape) / rows;
        const size_t c = (rows + sw - 1) / sw;
        const size_t first = std::min(rows, static_cast<size_t>(r) * c);
        const size_t valid_rows = std::min(rows, first + c) - first;
        std::vector<int64_t> shape = u.shape;
        shape[0] = static_cast<int64_t>(c);
        int idx = list.Add(fmt::format("{}#{}", u.name, r), shape, p == 0 ? block_pad : 1);
        if (r == 0) u.member = idx;
        E.pieces.push_back({static_cast<int>(p), first * cols, valid_rows * cols});
      }
    }
    list.Finalize(block_pad * sw);
    L.list = std::move(list);
    for (RuntimeParam& rp : L.runtime) rp.offset = 0;  // not a view of the buffer
  }
  E.uncovered = Uncovered(L.list, E.pieces);
  for (const RuntimeParam& rp : L.runtime) {
    bool contiguous = kind != ShardLayout::kDim0;
    if (contiguous) {
      for (int i = 1; i < rp.num_members; ++i)
        contiguous = contiguous && L.list.member(rp.first_member + i).offset ==
                                       L.list.member(rp.first_member + i - 1).end();
    }
    E.contiguous.push_back(contiguous);
  }
  return E;
}

void CopyMeter::Copy(void* dst, const void* src, size_t bytes, uint64_t CopyBytes::*path) {
  if (bytes == 0) return;
  ScopedTimer t(&seconds_);
  std::memcpy(dst, src, bytes);
  bytes_.*path += bytes;
}

}  // namespace sshsdp
