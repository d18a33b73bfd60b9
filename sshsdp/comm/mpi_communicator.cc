// MpiCommunicator: precondition checks, ring all-gather / reduce-scatter / all-reduce over
// MPI point-to-point, batched exchange, byte accounting by node.
#include "sshsdp/comm/mpi_communicator.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_runtime.h"
#include "sshsdp/comm/ring_bytes.h"
#include "sshsdp/comm/watchdog.h"
#include "sshsdp/numerics/stochastic_rounding.h"

namespace sshsdp {

namespace {

// Tags reserved for the ring collectives (above MpiCommunicator::kMaxUserTag).
constexpr int kTagAllGather = 32767;
constexpr int kTagReduceScatter = 32766;

bool IsReducible(DType t) { return t == DType::kF32 || t == DType::kBF16; }

inline float ToFloat(float x) { return x; }
inline float ToFloat(bf16 x) { return Bf16ToFloat(x); }
template <class T>
inline T FromFloat(float x);
template <>
inline float FromFloat<float>(float x) {
  return x;
}
template <>
inline bf16 FromFloat<bf16>(float x) {
  return FloatToBf16(x);
}

// acc[i] += local[i] (in fp32).
template <class L>
void AddLocal(float* acc, const L* local, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += ToFloat(local[i]);
}

// The last reduce-scatter step: total = partial + local, written or added into out. `partial`
// is null when there are no other contributions (a group of one). `out` may alias `local`
// exactly (in-place all-reduce): each element is read before it is written.
template <class L, class O>
void Finish(const float* partial, const L* local, O* out, size_t n, bool accumulate) {
  if (partial == nullptr) {
    if (accumulate) {
      for (size_t i = 0; i < n; ++i) out[i] = FromFloat<O>(ToFloat(out[i]) + ToFloat(local[i]));
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = FromFloat<O>(ToFloat(local[i]));
    }
    return;
  }
  if (accumulate) {
    for (size_t i = 0; i < n; ++i) {
      out[i] = FromFloat<O>(ToFloat(out[i]) + (partial[i] + ToFloat(local[i])));
    }
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = FromFloat<O>(partial[i] + ToFloat(local[i]));
  }
}

template <class L>
void FinishTo(const float* partial, const L* local, void* out, DType out_dtype, size_t n,
              bool accumulate) {
  if (out_dtype == DType::kF32) {
    Finish(partial, local, static_cast<float*>(out), n, accumulate);
  } else {
    Finish(partial, local, static_cast<bf16*>(out), n, accumulate);
  }
}

// n * count * elem_bytes, or CommError when it does not fit in size_t.
size_t CheckedBytes(size_t n, size_t count, size_t elem_bytes, const std::string& where) {
  SSHSDP_CHECK(count <= std::numeric_limits<size_t>::max() / (n * elem_bytes), CommError,
               "{}: count {} times {} ranks times {} bytes overflows the address space", where,
               count, n, elem_bytes);
  return n * count * elem_bytes;
}

}  // namespace

// Chunk j of a buffer cut into n chunks holds base + (j < rem) units of `unit` bytes or
// elements: even chunks when rem = 0, the all-reduce's uneven chunks otherwise.
struct MpiCommunicator::Chunks {
  size_t base = 0, rem = 0, unit = 1;
  static Chunks Even(size_t count) { return {count, 0, 1}; }
  static Chunks Cut(size_t total, int n) { return {total / n, total % n, 1}; }
  Chunks Times(size_t u) const { return {base, rem, unit * u}; }
  size_t size(int j) const { return (base + (static_cast<size_t>(j) < rem ? 1 : 0)) * unit; }
  size_t offset(int j) const { return (j * base + std::min(static_cast<size_t>(j), rem)) * unit; }
};

std::unique_ptr<MpiCommunicator> MpiCommunicator::World(int ranks_per_node) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  SSHSDP_CHECK(initialized && !finalized, CommError,
               "MpiCommunicator::World: MPI is not initialised; create an MpiRuntime (or run "
               "the program through RunMpiMain) first");
  int world_size = 0;
  CheckMpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MpiCommunicator::World: MPI_Comm_size");
  SSHSDP_CHECK(ranks_per_node > 0 && world_size % ranks_per_node == 0, CommError,
               "MpiCommunicator::World: ranks_per_node={} must be positive and divide the "
               "world size {} (every node holds the same number of consecutive ranks)",
               ranks_per_node, world_size);
  MPI_Comm comm = MPI_COMM_NULL;
  CheckMpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MpiCommunicator::World: MPI_Comm_dup");
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(comm, ranks_per_node, "world"));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int ranks_per_node, std::string label)
    : comm_(comm), ranks_per_node_(ranks_per_node), label_(std::move(label)) {
  CheckMpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int n = 0;
  CheckMpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  CheckMpi(MPI_Comm_size(comm_, &n), "MPI_Comm_size");
  MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  CheckMpi(MPI_Comm_group(comm_, &group), "MPI_Comm_group");
  CheckMpi(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group(MPI_COMM_WORLD)");
  std::vector<int> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = i;
  world_ranks_.resize(n);
  int rc = MPI_Group_translate_ranks(group, n, positions.data(), world_group, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  CheckMpi(rc, "MPI_Group_translate_ranks");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::Adopt(MPI_Comm comm, const char* label) const {
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(comm, ranks_per_node_, label));
}

int MpiCommunicator::world_rank(int position) const {
  SSHSDP_CHECK(position >= 0 && position < size(), CommError,
               "{}: position {} is outside the group of {}", name(), position, size());
  return world_ranks_[position];
}

std::string MpiCommunicator::name() const {
  std::string s = label_ + "{";
  const size_t n = world_ranks_.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 16 && i == 8) {
      s += "...,";
      i = n - 1;
    }
    s += fmt::format("{}{}", world_ranks_[i], i + 1 < n ? "," : "");
  }
  return s + "}";
}

bool MpiCommunicator::SameNode(int position) const {
  return world_rank(position) / ranks_per_node_ == world_ranks_[rank_] / ranks_per_node_;
}

void MpiCommunicator::set_max_message_bytes(size_t bytes) {
  SSHSDP_CHECK(bytes >= 1 && bytes <= static_cast<size_t>(INT_MAX), CommError,
               "{}: max message bytes {} must be in [1, INT_MAX]", name(), bytes);
  max_message_bytes_ = bytes;
}

void MpiCommunicator::CountSend(int position, size_t bytes) {
  if (SameNode(position)) {
    counters_.intra_node_bytes += bytes;
  } else {
    counters_.inter_node_bytes += bytes;
  }
}

void MpiCommunicator::Check(int rc, const char* op, const char* mpi_call) const {
  if (rc == MPI_SUCCESS) return;
  if (rc == MPI_ERR_IN_STATUS) {  // report the first failed request's own error
    for (const MPI_Status& st : statuses_) {
      if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) {
        rc = st.MPI_ERROR;
        break;
      }
    }
  }
  CheckMpi(rc, fmt::format("{} on {}: {}", op, name(), mpi_call));
}

void MpiCommunicator::RingStep(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                               int tag, const char* op) {
  const int n = size();
  const int next = (rank_ + 1) % n, prev = (rank_ + n - 1) % n;
  requests_.clear();
  auto* r = static_cast<char*>(recv);
  for (size_t off = 0; off < recv_bytes; off += max_message_bytes_) {
    int len = static_cast<int>(std::min(max_message_bytes_, recv_bytes - off));
    MPI_Request req;
    Check(MPI_Irecv(r + off, len, MPI_BYTE, prev, tag, comm_, &req), op, "MPI_Irecv");
    requests_.push_back(req);
  }
  const auto* s = static_cast<const char*>(send);
  for (size_t off = 0; off < send_bytes; off += max_message_bytes_) {
    int len = static_cast<int>(std::min(max_message_bytes_, send_bytes - off));
    MPI_Request req;
    Check(MPI_Isend(s + off, len, MPI_BYTE, next, tag, comm_, &req), op, "MPI_Isend");
    requests_.push_back(req);
  }
  if (requests_.empty()) return;
  statuses_.resize(requests_.size());
  WaitScope watched(op, name(), {world_rank(prev), world_rank(next)});
  Check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), statuses_.data()), op,
        "MPI_Waitall");
}

void MpiCommunicator::RingAllGather(char* buf, const Chunks& bytes, const char* op) {
  const int n = size(), p = rank_;
  for (int s = 0; s + 1 < n; ++s) {
    const int send_chunk = (p - s + n) % n;
    const int recv_chunk = (p - s - 1 + 2 * n) % n;
    RingStep(buf + bytes.offset(send_chunk), bytes.size(send_chunk), buf + bytes.offset(recv_chunk),
             bytes.size(recv_chunk), kTagAllGather, op);
  }
}

void MpiCommunicator::RingReduceScatter(const void* in, DType in_dtype, const Chunks& elems,
                                        void* out, DType out_dtype, bool accumulate, const char* op,
                                        const ReduceScatterOptions* options) {
  const int n = size(), p = rank_;
  const size_t in_size = DTypeSize(in_dtype);
  auto local = [&](int chunk) {
    return static_cast<const char*>(in) + elems.offset(chunk) * in_size;
  };
  auto finish = [&](const float* partial) {
    if (in_dtype == DType::kF32) {
      FinishTo(partial, reinterpret_cast<const float*>(local(p)), out, out_dtype, elems.size(p),
               accumulate);
    } else {
      FinishTo(partial, reinterpret_cast<const bf16*>(local(p)), out, out_dtype, elems.size(p),
               accumulate);
    }
  };
  if (n == 1) {
    finish(nullptr);
    return;
  }
  const size_t max_chunk = elems.size(0);  // chunk 0 is never smaller than the others
  if (scratch_.size() < 2 * max_chunk) scratch_.resize(2 * max_chunk);
  if (options != nullptr && options->partial_dtype == DType::kBF16) {
    // bf16sr: partials travel as bf16. Each intermediate hop sums the received partial and
    // its local slice in fp32 and stores the result with stochastic rounding; the draw of
    // element i of chunk c at hop s is the one of logical index s·total + offset(c) + i, so it
    // depends only on (key, hop, position) and the run reproduces bit for bit. The final hop
    // sums in fp32 and accumulates into `out` as in fp32 mode.
    const uint64_t total = elems.offset(n - 1) + elems.size(n - 1);
    if (scratch16_.size() < 2 * max_chunk) scratch16_.resize(2 * max_chunk);
    bf16* parts[2] = {scratch16_.data(), scratch16_.data() + max_chunk};
    float* sum = scratch_.data();
    const int first16 = (p - 1 + n) % n;
    const bf16* send16 = nullptr;
    if (in_dtype == DType::kBF16) {
      send16 = reinterpret_cast<const bf16*>(local(first16));  // exact: no rounding needed
    } else {
      StochasticRoundBf16(reinterpret_cast<const float*>(local(first16)), parts[1],
                          elems.size(first16), options->sr_key, elems.offset(first16));
      send16 = parts[1];
    }
    for (int s = 0; s + 1 < n; ++s) {
      const int send_chunk = (p - s - 1 + n) % n;
      const int recv_chunk = (p - s - 2 + 2 * n) % n;
      const size_t rn = elems.size(recv_chunk);
      bf16* recv = parts[s % 2];
      RingStep(send16, elems.size(send_chunk) * sizeof(bf16), recv, rn * sizeof(bf16),
               kTagReduceScatter, op);
      Bf16ToFloat(recv, sum, rn);
      if (s + 2 < n) {
        if (in_dtype == DType::kF32) {
          AddLocal(sum, reinterpret_cast<const float*>(local(recv_chunk)), rn);
        } else {
          AddLocal(sum, reinterpret_cast<const bf16*>(local(recv_chunk)), rn);
        }
        StochasticRoundBf16(sum, recv, rn, options->sr_key,
                            static_cast<uint64_t>(s + 1) * total + elems.offset(recv_chunk));
        send16 = recv;
      } else {
        finish(sum);
      }
    }
    return;
  }
  float* partials[2] = {scratch_.data(), scratch_.data() + max_chunk};

  // Step 0 sends this rank's own contribution to chunk p-1; partials travel as fp32.
  const int first = (p - 1 + n) % n;
  const float* send = nullptr;
  if (in_dtype == DType::kF32) {
    send = reinterpret_cast<const float*>(local(first));
  } else {
    Bf16ToFloat(reinterpret_cast<const bf16*>(local(first)), partials[1], elems.size(first));
    send = partials[1];
  }
  for (int s = 0; s + 1 < n; ++s) {
    const int send_chunk = (p - s - 1 + n) % n;
    const int recv_chunk = (p - s - 2 + 2 * n) % n;
    float* recv = partials[s % 2];
    RingStep(send, elems.size(send_chunk) * sizeof(float), recv,
             elems.size(recv_chunk) * sizeof(float), kTagReduceScatter, op);
    if (s + 2 < n) {
      if (in_dtype == DType::kF32) {
        AddLocal(recv, reinterpret_cast<const float*>(local(recv_chunk)), elems.size(recv_chunk));
      } else {
        AddLocal(recv, reinterpret_cast<const bf16*>(local(recv_chunk)), elems.size(recv_chunk));
      }
      send = recv;
    } else {
      finish(recv);  // recv_chunk == p: fused final reduction into `out`
    }
  }
}

void MpiCommunicator::AllGatherInPlace(void* buf, size_t count, DType dtype) {
  const std::string where = fmt::format("AllGatherInPlace on {}", name());
  CheckedBytes(size(), count, DTypeSize(dtype), where);
  SSHSDP_CHECK(count == 0 || buf != nullptr, CommError, "{}: buf is null with count {}", where,
               count);
  counters_.calls++;
  if (count == 0) return;
  CountSend((rank_ + 1) % size(), RingAllGatherSendBytes(size(), count, DTypeSize(dtype)));
  RingAllGather(static_cast<char*>(buf), Chunks::Even(count).Times(DTypeSize(dtype)),
                "AllGatherInPlace");
}

void MpiCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype) {
  const std::string where = fmt::format("AllGather on {}", name());
  const size_t e = DTypeSize(dtype);
  const size_t total = CheckedBytes(size(), count, e, where);
  SSHSDP_CHECK(count == 0 || send != nullptr, CommError, "{}: send is null with count {}", where,
               count);
  SSHSDP_CHECK(count == 0 || recv != nullptr, CommError, "{}: recv is null with count {}", where,
               count);
  char* own = static_cast<char*>(recv) + rank_ * count * e;
  const bool in_place = send == own;
  SSHSDP_CHECK(in_place || !Overlaps(send, count * e, recv, total), CommError,
               "{}: send overlaps recv; pass send = recv + rank()*count (in place) or disjoint "
               "buffers",
               where);
  counters_.calls++;
  if (count == 0) return;
  if (!in_place) {
    std::memcpy(own, send, count * e);
    counters_.local_copy_bytes += count * e;
  }
  CountSend((rank_ + 1) % size(), RingAllGatherSendBytes(size(), count, e));
  RingAllGather(static_cast<char*>(recv), Chunks::Even(count).Times(e), "AllGather");
}

void MpiCommunicator::ReduceScatter(const void* send, DType send_dtype, void* recv,
                                    DType recv_dtype, size_t count, bool accumulate) {
  ReduceScatterPartials(send, send_dtype, recv, recv_dtype, count, accumulate, {});
}

void MpiCommunicator::ReduceScatterPartials(const void* send, DType send_dtype, void* recv,
                                            DType recv_dtype, size_t count, bool accumulate,
                                            const ReduceScatterOptions& options) {
  const std::string where = fmt::format("ReduceScatter on {}", name());
  SSHSDP_CHECK(IsReducible(options.partial_dtype), CommError,
               "{}: partial dtype {} is not supported; use fp32 or bf16 (stochastic rounding)",
               where, DTypeName(options.partial_dtype));
  SSHSDP_CHECK(IsReducible(send_dtype), CommError,
               "{}: send_dtype {} is not supported; reduce fp32 or bf16 buffers", where,
               DTypeName(send_dtype));
  SSHSDP_CHECK(IsReducible(recv_dtype), CommError,
               "{}: recv_dtype {} is not supported; receive into fp32 or bf16", where,
               DTypeName(recv_dtype));
  const size_t send_bytes = CheckedBytes(size(), count, DTypeSize(send_dtype), where);
  const size_t recv_bytes = count * DTypeSize(recv_dtype);
  SSHSDP_CHECK(count == 0 || send != nullptr, CommError, "{}: send is null with count {}", where,
               count);
  SSHSDP_CHECK(count == 0 || recv != nullptr, CommError, "{}: recv is null with count {}", where,
               count);
  SSHSDP_CHECK(!Overlaps(send, send_bytes, recv, recv_bytes), CommError,
               "{}: send ({} bytes) and recv ({} bytes) overlap; the reduce-scatter reads every "
               "slice of send until its last step, so recv must be a separate buffer",
               where, send_bytes, recv_bytes);
  counters_.calls++;
  if (count == 0) return;
  CountSend((rank_ + 1) % size(),
            RingReduceScatterSendBytes(size(), count, DTypeSize(options.partial_dtype)));
  RingReduceScatter(send, send_dtype, Chunks::Even(count), recv, recv_dtype, accumulate,
                    "ReduceScatter", &options);
}

void MpiCommunicator::AllReduce(void* buf, size_t count, DType dtype) {
  const std::string where = fmt::format("AllReduce on {}", name());
  SSHSDP_CHECK(IsReducible(dtype), CommError,
               "{}: dtype {} is not supported; all-reduce fp32 or bf16 buffers", where,
               DTypeName(dtype));
  SSHSDP_CHECK(count == 0 || buf != nullptr, CommError, "{}: buf is null with count {}", where,
               count);
  CheckedBytes(1, count, DTypeSize(dtype), where);
  counters_.calls++;
  if (count == 0) return;
  const Chunks chunks = Chunks::Cut(count, size());
  char* own = static_cast<char*>(buf) + chunks.offset(rank_) * DTypeSize(dtype);
  // Partials travel as fp32 (4 bytes) for fp32 and bf16 buffers alike.
  CountSend((rank_ + 1) % size(),
            RingAllReduceSendBytes(size(), rank_, count, 4, DTypeSize(dtype)));
  RingReduceScatter(buf, dtype, chunks, own, dtype, /*accumulate=*/false, "AllReduce");
  RingAllGather(static_cast<char*>(buf), chunks.Times(DTypeSize(dtype)), "AllReduce");
}

void MpiCommunicator::Exchange(const std::vector<P2POp>& sends, const std::vector<P2POp>& recvs) {
  const std::string where = fmt::format("Exchange on {}", name());
  auto check = [&](const std::vector<P2POp>& ops, const char* list) {
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      SSHSDP_CHECK(op.peer >= 0 && op.peer < size(), CommError,
                   "{}: {}[{}].peer = {} is outside the group of {}", where, list, i, op.peer,
                   size());
      SSHSDP_CHECK(op.tag >= 0 && op.tag <= kMaxUserTag, CommError,
                   "{}: {}[{}].tag = {} is outside [0, {}]", where, list, i, op.tag, kMaxUserTag);
      SSHSDP_CHECK(op.bytes == 0 || op.data != nullptr, CommError,
                   "{}: {}[{}].data is null with {} bytes", where, list, i, op.bytes);
    }
  };
  check(sends, "sends");
  check(recvs, "recvs");
  counters_.calls++;

  // Every message is posted, a zero-byte one as one empty MPI message, so that both sides
  // agree on the matching whatever the sizes; larger ones are split into pieces.
  struct RecvPiece {
    size_t op;
    size_t bytes;
  };
  std::vector<RecvPiece> pieces;
  requests_.clear();
  auto post = [&](const P2POp& op, bool is_send, size_t index) {
    size_t off = 0;
    do {
      const size_t len = std::min(max_message_bytes_, op.bytes - off);
      MPI_Request req;
      char* p = static_cast<char*>(op.data) + off;
      if (is_send) {
        Check(MPI_Isend(p, static_cast<int>(len), MPI_BYTE, op.peer, op.tag, comm_, &req),
              "Exchange", "MPI_Isend");
      } else {
        Check(MPI_Irecv(p, static_cast<int>(len), MPI_BYTE, op.peer, op.tag, comm_, &req),
              "Exchange", "MPI_Irecv");
        pieces.push_back({index, len});
      }
      requests_.push_back(req);
      off += len;
    } while (off < op.bytes);
  };
  for (size_t i = 0; i < recvs.size(); ++i) post(recvs[i], false, i);
  const size_t num_recv_requests = requests_.size();
  for (size_t i = 0; i < sends.size(); ++i) {
    post(sends[i], true, i);
    CountSend(sends[i].peer, sends[i].bytes);
  }
  if (requests_.empty()) return;
  statuses_.resize(requests_.size());
  std::vector<int> peers;
  for (const auto* ops : {&sends, &recvs})
    for (const P2POp& o : *ops) peers.push_back(world_rank(o.peer));
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  WaitScope watched("point-to-point exchange", name(), std::move(peers));
  Check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), statuses_.data()),
        "Exchange", "MPI_Waitall");
  for (size_t k = 0; k < num_recv_requests; ++k) {
    int got = 0;
    MPI_Get_count(&statuses_[k], MPI_BYTE, &got);
    const P2POp& op = recvs[pieces[k].op];
    SSHSDP_CHECK(static_cast<size_t>(got) == pieces[k].bytes, CommError,
                 "{}: recvs[{}] (peer {}, tag {}, {} bytes) received a message of {} bytes "
                 "where {} were expected; the matching send must have the same size",
                 where, pieces[k].op, op.peer, op.tag, op.bytes, got, pieces[k].bytes);
  }
}

void MpiCommunicator::Barrier() {
  counters_.calls++;
  WaitScope watched("barrier", name());
  Check(MPI_Barrier(comm_), "Barrier", "MPI_Barrier");
}

std::unique_ptr<Communicator> MpiCommunicator::Split(int color, int key) {
  SSHSDP_CHECK(color >= 0, CommError,
               "Split on {}: color {} must be non-negative (every rank joins one sub-group)",
               name(), color);
  MPI_Comm comm = MPI_COMM_NULL;
  WaitScope watched("communicator split", name());
  Check(MPI_Comm_split(comm_, color, key, &comm), "Split", "MPI_Comm_split");
  return Adopt(comm, "split");
}

std::unique_ptr<Communicator> MpiCommunicator::Duplicate() {
  MPI_Comm comm = MPI_COMM_NULL;
  WaitScope watched("communicator duplicate", name());
  Check(MPI_Comm_dup(comm_, &comm), "Duplicate", "MPI_Comm_dup");
  auto dup = Adopt(comm, label_.c_str());
  dup->max_message_bytes_ = max_message_bytes_;
  return dup;
}

}  // namespace sshsdp
