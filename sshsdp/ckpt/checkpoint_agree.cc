// Failure agreement: every rank reports and every rank throws the same error, so no rank
// waits for a failed peer (see checkpoint.h).
#include <algorithm>
#include <cstring>

#include "sshsdp/ckpt/checkpoint_internal.h"

namespace sshsdp::ckpt_internal {

namespace {

constexpr size_t kReportBytes = 1024;

}  // namespace

std::vector<Report> Exchange(Communicator& world, const Report& mine) {
  std::vector<char> send(kReportBytes, 0), recv(kReportBytes * world.size());
  std::memcpy(send.data(), &mine.bytes, 8);
  std::memcpy(send.data() + 8, &mine.crc, 4);
  const int32_t kind = mine.kind;
  std::memcpy(send.data() + 12, &kind, 4);
  std::memcpy(send.data() + 16, mine.message.data(),
              std::min(mine.message.size(), kReportBytes - 17));
  world.AllGather(send.data(), recv.data(), kReportBytes, DType::kE4M3);  // raw bytes
  std::vector<Report> out(world.size());
  for (int r = 0; r < world.size(); ++r) {
    const char* p = recv.data() + r * kReportBytes;
    int32_t k = 0;
    std::memcpy(&out[r].bytes, p, 8);
    std::memcpy(&out[r].crc, p + 8, 4);
    std::memcpy(&k, p + 12, 4);
    out[r].kind = k;
    out[r].message = std::string(p + 16, strnlen(p + 16, kReportBytes - 16));
  }
  return out;
}

// Throws, on every rank alike, the lowest failing rank's error.
void ThrowIfAny(const std::vector<Report>& reports) {
  for (size_t r = 0; r < reports.size(); ++r) {
    const Report& e = reports[r];
    if (e.kind == 0) continue;
    const std::string msg =
        reports.size() > 1 ? fmt::format("{} (reported by rank {})", e.message, r) : e.message;
    switch (e.kind) {
      case 1:
        throw IoError(msg);
      case 2:
        throw ConfigError(msg);
      case 3:
        throw LayoutError(msg);
      default:
        throw Error(msg);
    }
  }
}

void Agree(Communicator& world, const Report& mine) { ThrowIfAny(Exchange(world, mine)); }

}  // namespace sshsdp::ckpt_internal
