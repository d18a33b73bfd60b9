// AgreeOnOptions (option_agreement.h): a 64-bit hash per rank, all-gathered; only when they
// differ are the texts gathered, to name the first difference.
#include "sshsdp/cli/option_agreement.h"

#include <fmt/format.h>
#include <mpi.h>

#include <cstdint>
#include <sstream>
#include <vector>

#include "sshsdp/base/error.h"
#include "sshsdp/comm/mpi_runtime.h"

namespace sshsdp {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::string FirstDifferingLine(const std::string& a, const std::string& b) {
  std::istringstream ia(a), ib(b);
  std::string la, lb;
  while (true) {
    const bool ha = static_cast<bool>(std::getline(ia, la));
    const bool hb = static_cast<bool>(std::getline(ib, lb));
    if (!ha && !hb) return "";
    if (ha != hb || la != lb)
      return fmt::format("'{}' vs '{}'", ha ? la : "(none)", hb ? lb : "(none)");
  }
}

std::string RankDifferences::Ranks() const {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

std::string RankDifferences::RanksWere() const {
  return Ranks() + (ranks.size() == 1 ? " was" : " were");
}

RankDifferences DifferencesFromRankZero(const std::string& text) {
  int size = 1, rank = 0;
  CheckMpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  CheckMpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  RankDifferences out;
  if (size == 1) return out;
  const uint64_t mine = Fnv1a(text);
  std::vector<uint64_t> hashes(static_cast<size_t>(size));
  CheckMpi(MPI_Allgather(&mine, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD),
           "MPI_Allgather (agreement)");
  for (int r = 1; r < size; ++r) {
    if (hashes[static_cast<size_t>(r)] != hashes[0]) out.ranks.push_back(r);
  }
  if (out.ranks.empty()) return out;
  // Rank 0's text and the lowest differing rank's, to every rank (the same result on all).
  const int other = out.ranks.front();
  std::string texts[2];
  for (int i = 0; i < 2; ++i) {
    const int root = i == 0 ? 0 : other;
    int length = rank == root ? static_cast<int>(text.size()) : 0;
    CheckMpi(MPI_Bcast(&length, 1, MPI_INT, root, MPI_COMM_WORLD), "MPI_Bcast (agreement)");
    texts[i] = rank == root ? text : std::string(static_cast<size_t>(length), '\0');
    CheckMpi(MPI_Bcast(texts[i].data(), length, MPI_CHAR, root, MPI_COMM_WORLD),
             "MPI_Bcast (agreement)");
  }
  out.first = FirstDifferingLine(texts[1], texts[0]);
  return out;
}

void AgreeOnOptions(const std::string& options, std::string_view program) {
  const RankDifferences d = DifferencesFromRankZero(options);
  if (d.ranks.empty()) return;
  throw ConfigError(fmt::format(
      "{}: {} started with options that differ from rank 0's (rank {} vs rank 0: {}); every "
      "rank must run the same command (the same flags and --config file)",
      program, d.RanksWere(), d.ranks.front(), d.first));
}

}  // namespace sshsdp
