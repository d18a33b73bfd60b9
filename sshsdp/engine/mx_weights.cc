// MxWeights: G on 32-row bands through the update planner, S sharded like W, Tw scale
// relayout (see mx_weights.h).
#include "sshsdp/engine/mx_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "sshsdp/base/error.h"
#include "sshsdp/engine/engine_internal.h"
#include "sshsdp/update/update_unit.h"

namespace sshsdp {

namespace {
constexpr int kMxScaleTag = 7101;  // scale fragments, execution rank → S owners
}  // namespace

bool MxWeights::GroupIsMx(const GroupLayout& layout) {
  for (const UpdateParam& u : layout.update)
    if (u.kind == UpdateKind::kEmbedding) return false;
  return !layout.update.empty();
}

MxWeights::MxWeights(const std::vector<const GroupLayout*>& layouts,
                     const std::vector<const ShardChain*>& chains, const Topology& topo, int rank,
                     ScaleLayout layout, Communicator* p2p, MemoryAccount* account,
                     const std::vector<bool>& mx_groups, Backend& backend)
    : topo_(topo),
      rank_(rank),
      replica_(topo.Coord(rank).d),
      layout_(layout),
      p2p_(p2p),
      account_(account),
      backend_(&backend),
      on_device_(!backend.host_memory()),
      chains_(chains) {
  std::vector<UpdateUnit> units;
  groups_.resize(layouts.size());
  for (size_t g = 0; g < layouts.size(); ++g) {
    Group& G = groups_[g];
    G.layout = layouts[g];
    G.mx = mx_groups.empty() ? GroupIsMx(*layouts[g]) : mx_groups.at(g);
    if (!G.mx) continue;
    const GroupLayout& L = *layouts[g];
    G.s_list = TensorList(L.list.name() + ".s", DType::kUE8M0);
    for (size_t m = 0; m < L.update.size(); ++m) {
      int64_t rows = 0, cols = 0;
      MatrixView(L.update[m].shape, &rows, &cols);
      G.rows.push_back(rows);
      G.cols.push_back(cols);
      G.s_list.Add(L.update[m].name + ".s", {MxWeightScaleCount(rows, cols)});
      const size_t off = L.list.member(m).offset;
      for (int64_t b = 0; b < MxNumBands(rows); ++b) {
        const MxBand band = MxWeightBand(rows, cols, b);
        UpdateUnit u;
        u.name = L.update[m].name + ".band" + std::to_string(b);
        u.group = static_cast<int>(g);
        u.first_member = static_cast<int>(m);
        u.num_members = 1;
        u.kind = L.update[m].kind;
        u.begin = off + static_cast<size_t>(band.elem_begin);
        u.rows = band.row_end - band.row_begin;
        u.cols = cols;
        units.push_back(u);
        bands_.push_back({static_cast<int>(g), static_cast<int>(m), b});
      }
    }
    G.s_list.Finalize(static_cast<size_t>(topo.so()));
    G.s_chain = std::make_unique<ShardChain>(G.s_list, topo, rank);
    G.z1 = G.s_chain->LocalRange(Shard::kZero1);
    G.z3 = G.s_chain->LocalRange(Shard::kZero3);
    G.s_chunk = G.s_list.padded_numel() / static_cast<size_t>(topo.so());
    G.s_z3.assign(G.z3.size(), 0);
    G.s_full.assign(G.s_list.padded_numel(), 0);
    size_t off = 0;
    for (size_t r = 0; r < L.runtime.size(); ++r) {
      std::vector<MxScaleGrid> parts = Parts(static_cast<int>(g), static_cast<int>(r));
      const size_t bytes = ScaleLayoutBytes(layout_, PackedScales(parts, MxOperand::kAsStored));
      G.rt_offset.push_back(off);
      G.rt_bytes.push_back(bytes);
      off += (bytes + 63) / 64 * 64;
    }
    G.s_prime.assign(std::max<size_t>(off, 64), 0);
    if (on_device_) {  // (freed with the group, a throw below included)
      const BackendFree free{backend_};
      G.s_prime_dev = {static_cast<uint8_t*>(backend_->Alloc(G.s_prime.size())), free};
      G.s_bands.assign(G.s_list.padded_numel(), 0);
      G.s_bands_dev = {static_cast<uint8_t*>(backend_->Alloc((G.s_bands.size() + 63) / 64 * 64)),
                       free};
    }
    try {  // dry run on zero scales: a layout the parts cannot use fails here, at setup
      Relayout(static_cast<int>(g));
    } catch (const NumericsError& e) {
      throw ConfigError(fmt::format("--scale-layout {} cannot hold group {}'s runtime weights: {}",
                                    ScaleLayoutName(layout_), L.group, e.what()));
    }
  }
  band_scales_.resize(bands_.size());
  if (units.empty()) {
    if (account_) account_->Allocate("scales", persistent_bytes());
    return;
  }

  UpdateProgram prog{
      "mx_quantize",
      {{"main", DType::kF32, FieldRole::kState}, {"q", DType::kE4M3, FieldRole::kTemporary}},
      {}};
  for (size_t i = 0; i < units.size(); ++i) band_index_[{units[i].group, units[i].begin}] = i;
  // f0 (unit = one 32-row band): codes and scales of the whole band on its execution rank.
  prog.stages.push_back({"quantize",
                         {{"main", Extent::Unit()}},
                         {{"q", Extent::Unit()}},
                         {},
                         nullptr,
                         [this](const StageBatch& b) { QuantizeBands(b); }});
  // f1 (elementwise): each owner stores its own codes into its ZeRO-1 slice of Wᶻ³.
  prog.stages.push_back(
      {"store", {{"q", Extent::Elements(1)}}, {}, {}, nullptr, [this](const StageBatch& b) {
         for (const StageItem& it : b.items) {
           const int g = it.unit->group;
           const size_t z1 = chains_[g]->LocalRange(Shard::kZero1).begin;
           uint8_t* dst = codes_z1_[g] + (it.begin - z1);
           backend_->Copy(dst, it.data[0], static_cast<size_t>(it.numel));
         }
       }});
  plan_ = std::make_shared<const UpdatePlan>(std::move(prog), std::move(units), chains, replica_);
  exec_ = std::make_unique<UpdateExecutor>(plan_, chains, rank, p2p, *backend_, account);
  // Last: a throw above (plan, executor) must not leave the scales accounted.
  if (account_) account_->Allocate("scales", persistent_bytes());
}

MxWeights::~MxWeights() {
  if (account_) account_->Free("scales", persistent_bytes());
}

size_t MxWeights::Bytes(bool on_device) const {
  size_t b = 0;
  for (const Group& G : groups_) {
    if (!G.mx) continue;
    b += G.s_z3.size() + G.s_full.size() + G.s_prime.size();
    const size_t bands = G.s_list.padded_numel();
    if (on_device) b += G.s_prime.size() + (bands + 63) / 64 * 64 + bands;
  }
  return b;
}

void MxWeights::QuantizeBands(const StageBatch& b) {
  // f0: codes and scales of each whole band on its execution rank, on the backend. On a device
  // the scales are written into the group's band-scale buffer there and read back once per group.
  std::vector<bool> touched(groups_.size(), false);
  for (const StageItem& it : b.items) {
    const size_t u = band_index_.at({it.unit->group, it.unit->begin});
    const BandRef& br = bands_[u];
    Group& G = groups_[br.group];
    const int64_t rows = G.rows[br.member], cols = G.cols[br.member];
    const auto* band = static_cast<const float*>(it.data[0]);
    auto* q = static_cast<uint8_t*>(it.data[1]);
    std::vector<uint8_t>& s = band_scales_[u];
    s.resize(static_cast<size_t>(MxBlocks(cols)));
    const MxBand mb = MxWeightBand(rows, cols, br.band);
    backend_->MxQuantizeWeight(band, mb.row_end - mb.row_begin, cols, q,
                               on_device_ ? G.s_bands_dev.get() + ScaleBandBegin(u) : s.data(),
                               MxOptions{});
    touched[br.group] = true;
    stats_.bands_executed++;
  }
  if (!on_device_) return;
  for (size_t g = 0; g < groups_.size(); ++g)
    if (touched[g])
      backend_->CopyOut(groups_[g].s_bands.data(), groups_[g].s_bands_dev.get(),
                        groups_[g].s_bands.size());
  for (const StageItem& it : b.items) {
    const size_t u = band_index_.at({it.unit->group, it.unit->begin});
    const Group& G = groups_[bands_[u].group];
    const auto* s = G.s_bands.data() + ScaleBandBegin(u);
    band_scales_[u].assign(s, s + MxBlocks(G.cols[bands_[u].member]));
  }
}

std::vector<MxScaleGrid> MxWeights::Parts(int g, int r) const {
  const Group& G = groups_[g];
  const RuntimeParam& rp = G.layout->runtime[r];
  std::vector<MxScaleGrid> parts;
  for (int m = rp.first_member; m < rp.first_member + rp.num_members; ++m)
    parts.push_back({G.s_full.data() + G.s_list.member(m).offset, G.rows[m], G.cols[m], 32});
  return parts;
}

void MxWeights::Quantize(const std::vector<const float*>& main_z1,
                         const std::vector<uint8_t*>& codes_z1) {
  stats_ = {};
  if (!exec_) return;
  SSHSDP_CHECK(p2p_ != nullptr, PlanError,
               "MxWeights: built for a plan (no communicator); G cannot run");
  codes_z1_ = codes_z1;
  std::vector<Zero1State> state(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    state[g].chunk = chains_[g]->LocalRange(Shard::kZero1);
    state[g].fields["main"] = const_cast<float*>(main_z1[g]);
  }
  exec_->Run(state, ScalarState{});
  stats_.bytes_sent = exec_->last_run().bytes_sent;
  stats_.split_bands = static_cast<uint64_t>(plan_->num_split());

  // Scales: the execution rank of each band → the owners of the band's S elements.
  std::vector<P2POp> sends, recvs;
  for (const ScaleMessage& m : ScaleMessages()) {
    if (m.exec != rank_ && m.owner != rank_) continue;
    Group& G = groups_[m.group];
    const size_t s0 = ScaleBandBegin(m.unit);
    // This rank's own S elements (only formed when it owns them: lo is in its ZeRO-1 slice).
    auto dst = [&] { return G.s_z3.data() + (G.z1.begin - G.z3.begin) + (m.lo - G.z1.begin); };
    uint8_t* src = band_scales_[m.unit].data() + (m.lo - s0);
    if (m.exec == rank_ && m.owner == rank_) {
      std::memcpy(dst(), src, m.hi - m.lo);
    } else if (m.exec == rank_) {
      sends.push_back({m.owner, src, m.hi - m.lo, kMxScaleTag});
      stats_.bytes_sent += m.hi - m.lo;
    } else {
      recvs.push_back({m.exec, dst(), m.hi - m.lo, kMxScaleTag});
    }
  }
  if (!sends.empty() || !recvs.empty()) p2p_->Exchange(sends, recvs);
  codes_z1_.clear();
}

uint64_t MxWeights::temporary_bytes() const { return exec_ ? exec_->temporary_bytes() : 0; }

size_t MxWeights::ScaleBandBegin(size_t u) const {
  const BandRef& br = bands_[u];
  const Group& G = groups_[br.group];
  return G.s_list.member(br.member).offset +
         static_cast<size_t>(br.band) * static_cast<size_t>(MxBlocks(G.cols[br.member]));
}

std::vector<MxWeights::ScaleMessage> MxWeights::ScaleMessages() const {
  std::vector<ScaleMessage> out;
  for (size_t u = 0; u < bands_.size(); ++u) {
    const BandRef& br = bands_[u];
    const Group& G = groups_[br.group];
    const int exec = plan_->placements()[u].exec_rank;
    const size_t s0 = ScaleBandBegin(u);
    const size_t s1 = s0 + static_cast<size_t>(MxBlocks(G.cols[br.member]));
    for (size_t j = s0 / G.s_chunk; j * G.s_chunk < s1; ++j) {
      const int owner = topo_.Zero1ChunkOwner(static_cast<int>(j), replica_);
      out.push_back({br.group, exec, owner, u, std::max(s0, j * G.s_chunk),
                     std::min(s1, (j + 1) * G.s_chunk)});
    }
  }
  return out;
}

void MxWeights::QuantizeFull(int g, const float* full_main, uint8_t* codes) {
  SSHSDP_CHECK(!on_device_, PlanError,
               "MxWeights: quantize-every-gather (②) runs on host memory only");
  Group& G = groups_[g];
  for (size_t m = 0; m < G.rows.size(); ++m) {
    const size_t off = G.layout->list.member(m).offset;
    MxQuantizeWeight(full_main + off, G.rows[m], G.cols[m], codes + off,
                     G.s_full.data() + G.s_list.member(m).offset);
  }
}

void MxWeights::Relayout(int g) {
  Group& G = groups_[g];
  for (size_t r = 0; r < G.layout->runtime.size(); ++r) {
    std::vector<MxScaleGrid> parts = Parts(g, static_cast<int>(r));
    RelayoutPackedScales(parts, MxOperand::kAsStored, layout_, G.s_prime.data() + G.rt_offset[r],
                         G.rt_bytes[r]);
  }
  if (on_device_) backend_->CopyIn(G.s_prime_dev.get(), G.s_prime.data(), G.s_prime.size());
}

}  // namespace sshsdp
