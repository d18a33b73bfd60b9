// RegisteredSlots: a registered root cut into equal slots handed out lowest-free-first, so
// every member takes the same slot — the symmetric offset (see direct_communicator.h).
#include "sshsdp/comm/direct_communicator.h"

#include <algorithm>
#include <memory>
#include <string>

#include "sshsdp/base/error.h"

namespace sshsdp {

RegisteredSlots::RegisteredSlots(DirectCommunicator& comm, const std::string& name,
                                 size_t slot_bytes, int slots)
    : name_(name), slot_bytes_((slot_bytes + 63) / 64 * 64) {
  SSHSDP_CHECK(slots >= 1, CommError, "registered slots '{}': need at least one slot, got {}", name,
               slots);
  auto root = std::make_unique<DataNode>(name);
  for (int i = 0; i < slots; ++i) {
    root->AddChild("slot" + std::to_string(i), DType::kF32, {static_cast<int64_t>(slot_bytes_ / 4)},
                   DataNode::kAuto, 64);
  }
  root->Finalize();
  root_ = &comm.Register(std::move(root));
  for (const auto& c : root_->children()) ptrs_.push_back(c->data());
  used_.assign(ptrs_.size(), false);
}

void* RegisteredSlots::Acquire() {
  for (size_t i = 0; i < ptrs_.size(); ++i) {
    if (used_[i]) continue;
    used_[i] = true;
    return ptrs_[i];
  }
  throw CommError(fmt::format(
      "registered slots '{}': all {} slots of {} bytes are in use; more buffers are live at "
      "once than the schedule declared — register more slots",
      name_, ptrs_.size(), slot_bytes_));
}

void RegisteredSlots::Release(void* p) {
  for (size_t i = 0; i < ptrs_.size(); ++i) {
    if (ptrs_[i] != p) continue;
    SSHSDP_CHECK(used_[i], CommError, "registered slots '{}': slot {} released twice", name_, i);
    used_[i] = false;
    return;
  }
  throw CommError(fmt::format("registered slots '{}': {} is not one of its slots", name_, p));
}

}  // namespace sshsdp
