// ChooseDeviceCommPath (cli/train_backend.h): how `sshsdp train --backend cuda` moves device
// buffers on several ranks, from the world, the nodes, the layout and --comm-path — checked
// here for every branch because no GPU runs it in CI.
#include "sshsdp/cli/train_backend.h"

#include <gtest/gtest.h>

#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {
namespace {

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ChooseDeviceCommPath, RuntimeGroupsInANodeGoDirect) {
  // Plain ZeRO-3 on one node: direct, nothing staged.
  DeviceCommChoice c = ChooseDeviceCommPath(4, 0, 4, 4, 4, "collective", "cuda");
  EXPECT_EQ(c.path, CommPath::kDirect);
  EXPECT_TRUE(Has(c.note, "CUDA IPC")) << c.note;
  EXPECT_FALSE(Has(c.note, "staged")) << c.note;
  // HSDP over two nodes of 2 (sg = 2 divides them): direct inside, the outer phase staged.
  c = ChooseDeviceCommPath(4, 2, 2, 2, 2, "collective", "cuda");
  EXPECT_EQ(c.path, CommPath::kDirect);
  EXPECT_TRUE(Has(c.note, "staged through host memory")) << c.note;
}

TEST(ChooseDeviceCommPath, GroupsSpanningNodesOrAskedForGoOverNccl) {
  DeviceCommChoice c = ChooseDeviceCommPath(4, 2, 4, 4, 4, "collective", "cuda");
  EXPECT_EQ(c.path, CommPath::kNccl);
  EXPECT_TRUE(Has(c.note, "--sg 4 span nodes of 2 ranks")) << c.note;
  c = ChooseDeviceCommPath(4, 0, 2, 2, 4, "nccl", "cuda");
  EXPECT_EQ(c.path, CommPath::kNccl);
  EXPECT_TRUE(c.note.empty()) << c.note;  // the option chose it
}

TEST(ChooseDeviceCommPath, NoRuntimeCollectiveStaysOnMpiWithTheOuterPhaseStaged) {
  DeviceCommChoice c = ChooseDeviceCommPath(3, 0, 1, 1, 3, "collective", "cuda");
  EXPECT_EQ(c.path, CommPath::kCollective);
  EXPECT_TRUE(Has(c.note, "sw = sg = 1")) << c.note;
  EXPECT_TRUE(Has(c.note, "staged")) << c.note;
  // Across nodes too (sg = 1 divides any node), and --comm-path direct is honoured.
  EXPECT_EQ(ChooseDeviceCommPath(4, 1, 1, 1, 1, "collective", "cuda").path, CommPath::kCollective);
  EXPECT_EQ(ChooseDeviceCommPath(4, 1, 1, 1, 4, "direct", "cuda").path, CommPath::kDirect);
}

TEST(ChooseDeviceCommPath, DirectAcrossNodesIsRefusedNamingTheFix) {
  try {
    ChooseDeviceCommPath(4, 2, 2, 4, 4, "direct", "cuda:0");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(Has(m, "--sg 4 span nodes of 2 ranks: use --comm-path nccl")) << m;
  }
}

}  // namespace
}  // namespace sshsdp
