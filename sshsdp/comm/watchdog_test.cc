// The watchdog's message for a stalled wait: the operation, the group, each peer named once in
// rank order (a wait may list a peer twice: both directions of an exchange), or "every member".
#include "sshsdp/comm/watchdog.h"

#include <gtest/gtest.h>

namespace sshsdp {
namespace {

TEST(Watchdog, NamesEachPeerOnceInOrder) {
  const std::string m = DescribeStalledWait("Exchange", "world", {3, 1, 1, 3, 2}, 4.04, 4);
  EXPECT_NE(m.find("waited 4.0 s (--comm-timeout 4 s) in Exchange on world for world ranks 1, "
                   "2, 3;"),
            std::string::npos)
      << m;
}

TEST(Watchdog, NoPeersMeansEveryMember) {
  const std::string m = DescribeStalledWait("AllGather", "split{0,1}", {}, 12.0, 10);
  EXPECT_NE(m.find("in AllGather on split{0,1} for every member;"), std::string::npos) << m;
}

}  // namespace
}  // namespace sshsdp
