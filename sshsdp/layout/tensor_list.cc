// TensorList: packing members into one flat buffer, tail padding only.
#include "sshsdp/layout/tensor_list.h"

#include "sshsdp/base/error.h"

namespace sshsdp {

size_t NumElements(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

TensorList::TensorList(std::string name, DType dtype) : name_(std::move(name)), dtype_(dtype) {}

int TensorList::Add(std::string name, std::vector<int64_t> shape, size_t align) {
  SSHSDP_CHECK(!finalized_, LayoutError, "tensor list '{}' is finalized; cannot add '{}'", name_,
               name);
  SSHSDP_CHECK(align > 0, LayoutError, "tensor list '{}': member '{}' needs align >= 1", name_,
               name);
  for (int64_t d : shape)
    SSHSDP_CHECK(d > 0, LayoutError,
                 "tensor list '{}': member '{}' has shape {} with a dimension < 1", name_, name,
                 ShapeString(shape));
  SSHSDP_CHECK(Find(name) < 0, LayoutError, "tensor list '{}' already has a member named '{}'",
               name_, name);
  TensorListMember m;
  m.name = std::move(name);
  m.numel = NumElements(shape);
  m.shape = std::move(shape);
  m.offset = (numel_ + align - 1) / align * align;
  numel_ = m.offset + m.numel;
  members_.push_back(std::move(m));
  return static_cast<int>(members_.size()) - 1;
}

void TensorList::Finalize(size_t pad_multiple) {
  SSHSDP_CHECK(!finalized_, LayoutError, "tensor list '{}' finalized twice", name_);
  SSHSDP_CHECK(pad_multiple > 0, LayoutError, "tensor list '{}': pad multiple must be >= 1", name_);
  padded_numel_ = (numel_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  finalized_ = true;
}

int TensorList::Find(const std::string& name) const {
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace sshsdp
