// DataNode: offset resolution, tree checks and binding of views to the root's storage.
#include "sshsdp/layout/data_node.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "sshsdp/base/error.h"
#include "sshsdp/layout/tensor_list.h"

namespace sshsdp {
DataNode::DataNode(std::string name, size_t bytes)
    : name_(std::move(name)), dtype_(DType::kF32), bytes_(bytes) {
  root_sized_from_children_ = (bytes == 0);
}

DataNode::DataNode(std::string name, DataNode* parent, DType dtype, std::vector<int64_t> shape,
                   size_t offset, size_t align, View view)
    : name_(std::move(name)),
      parent_(parent),
      dtype_(dtype),
      shape_(std::move(shape)),
      bytes_(NumElements(shape_) * DTypeSize(dtype)),
      offset_(offset),
      align_(align),
      view_(view) {}

DataNode::~DataNode() {
  if (is_root() && owned_) std::free(owned_);
}

const DataNode& DataNode::root() const {
  const DataNode* n = this;
  while (n->parent_) n = n->parent_;
  return *n;
}

bool DataNode::finalized() const { return root().finalized_; }
bool DataNode::bound() const { return root().base_ != nullptr; }

std::string DataNode::path() const { return parent_ ? parent_->path() + "/" + name_ : name_; }

size_t DataNode::numel() const { return is_root() ? bytes_ : NumElements(shape_); }

DataNode* DataNode::FindChild(const std::string& name) const {
  for (const auto& c : children_)
    if (c->name_ == name) return c.get();
  return nullptr;
}

DataNode& DataNode::AddChild(std::string name, DType dtype, std::vector<int64_t> shape,
                             size_t byte_offset, size_t align, View view) {
  SSHSDP_CHECK(!finalized(), LayoutError, "data node '{}' is finalized; cannot add child '{}'",
               path(), name);
  for (int64_t d : shape)
    SSHSDP_CHECK(d >= 0, LayoutError, "data node '{}/{}': negative dimension in shape {}", path(),
                 name, ShapeString(shape));
  size_t a = std::max(DTypeSize(dtype), align);
  if (byte_offset == kAuto) {
    byte_offset = RoundUp(next_auto_, a);
  } else {
    SSHSDP_CHECK(byte_offset % DTypeSize(dtype) == 0, LayoutError,
                 "data node '{}/{}': byte offset {} is not a multiple of its {} element size {}",
                 path(), name, byte_offset, DTypeName(dtype), DTypeSize(dtype));
    SSHSDP_CHECK(align == 0 || byte_offset % align == 0, LayoutError,
                 "data node '{}/{}': byte offset {} breaks the requested alignment {}", path(),
                 name, byte_offset, align);
  }
  children_.push_back(std::unique_ptr<DataNode>(
      new DataNode(std::move(name), this, dtype, std::move(shape), byte_offset, a, view)));
  DataNode& c = *children_.back();
  next_auto_ = std::max(next_auto_, byte_offset + c.bytes_);
  return c;
}

void DataNode::Resolve(size_t root_offset) {
  root_offset_ = root_offset;
  for (auto& c : children_) c->Resolve(root_offset_ + c->offset_);
}

void DataNode::Check() const {
  for (const auto& c : children_) {
    SSHSDP_CHECK(c->offset_ + c->bytes_ <= bytes_, LayoutError,
                 "data node '{}' ({} bytes at offset {}) extends past its parent '{}' ({} bytes)",
                 c->path(), c->bytes_, c->offset_, path(), bytes_);
  }
  std::vector<const DataNode*> excl;
  for (const auto& c : children_)
    if (c->view_ == View::kExclusive && c->bytes_ > 0) excl.push_back(c.get());
  std::sort(excl.begin(), excl.end(),
            [](const DataNode* x, const DataNode* y) { return x->offset_ < y->offset_; });
  for (size_t i = 1; i < excl.size(); ++i) {
    const DataNode* p = excl[i - 1];
    const DataNode* q = excl[i];
    SSHSDP_CHECK(p->offset_ + p->bytes_ <= q->offset_, LayoutError,
                 "data nodes '{}' [{}, {}) and '{}' [{}, {}) overlap; add one as View::kAlias "
                 "if sharing storage is intended",
                 p->path(), p->offset_, p->offset_ + p->bytes_, q->path(), q->offset_,
                 q->offset_ + q->bytes_);
  }
  for (const auto& c : children_) c->Check();
}

void DataNode::Finalize() {
  SSHSDP_CHECK(is_root(), LayoutError, "finalize the root of '{}', not the view", path());
  SSHSDP_CHECK(!finalized_, LayoutError, "data tree '{}' finalized twice", name_);
  if (root_sized_from_children_) {
    size_t end = 0;
    for (const auto& c : children_) end = std::max(end, c->offset_ + c->bytes_);
    bytes_ = RoundUp(end, kRootAlignment);
  }
  Resolve(0);
  Check();
  finalized_ = true;
}

void DataNode::FireBind(void* base) {
  void* p = base ? static_cast<char*>(base) + root_offset_ : nullptr;
  for (auto& cb : callbacks_) cb(p);
  for (auto& c : children_) c->FireBind(base);
}

void DataNode::Allocate(MemoryAccount* account, std::string category) {
  SSHSDP_CHECK(is_root(), LayoutError, "allocate the root of '{}', not the view", path());
  SSHSDP_CHECK(finalized_, LayoutError, "data tree '{}': finalize before allocating", name_);
  SSHSDP_CHECK(base_ == nullptr, LayoutError, "data tree '{}' is already bound; release it first",
               name_);
  size_t n = RoundUp(std::max<size_t>(bytes_, 1), kRootAlignment);
  owned_ = std::aligned_alloc(kRootAlignment, n);
  SSHSDP_CHECK(owned_ != nullptr, LayoutError, "data tree '{}': out of memory allocating {} bytes",
               name_, n);
  std::memset(owned_, 0, n);
  owned_bytes_ = bytes_;
  base_ = owned_;
  account_ = account;
  category_ = std::move(category);
  if (account_) account_->Allocate(category_, owned_bytes_);
  FireBind(base_);
}

void DataNode::AttachExternal(void* base, size_t bytes) {
  SSHSDP_CHECK(is_root(), LayoutError, "attach memory to the root of '{}', not the view", path());
  SSHSDP_CHECK(finalized_, LayoutError, "data tree '{}': finalize before attaching", name_);
  SSHSDP_CHECK(base != nullptr, LayoutError, "data tree '{}': cannot attach a null base", name_);
  SSHSDP_CHECK(base_ == nullptr || base_ == base, LayoutError,
               "data tree '{}': binding changed from {} to {} while bound (registered bases must "
               "stay stable); release first",
               name_, base_, base);
  SSHSDP_CHECK(reinterpret_cast<uintptr_t>(base) % kRootAlignment == 0, LayoutError,
               "data tree '{}': external base {} is not {}-byte aligned", name_, base,
               kRootAlignment);
  SSHSDP_CHECK(bytes >= bytes_, LayoutError,
               "data tree '{}' needs {} bytes but the external region holds {}", name_, bytes_,
               bytes);
  if (base_ == base) return;
  base_ = base;
  FireBind(base_);
}

void DataNode::Release() {
  SSHSDP_CHECK(is_root(), LayoutError, "release the root of '{}', not the view", path());
  if (!base_) return;
  FireBind(nullptr);
  if (owned_) {
    std::free(owned_);
    owned_ = nullptr;
    if (account_) account_->Free(category_, owned_bytes_);
  }
  base_ = nullptr;
}

void DataNode::OnBind(BindCallback cb) {
  callbacks_.push_back(std::move(cb));
  if (bound()) callbacks_.back()(data());
}

void* DataNode::data() const {
  const DataNode& r = root();
  return r.base_ ? static_cast<char*>(r.base_) + root_offset_ : nullptr;
}

}  // namespace sshsdp
