// DataNode: the data tree. Only the root owns storage; every other node is a view at a
// byte offset inside its parent whose shape and dtype fix its size (paper §3.2; docs/design.md, Two
// kinds of parameters).
//
// This is how sshsdp packs without copying: a runtime weight W′ is a view over the update
// weights W, each head's matrix is a child view of the packed projection, G′ has one view
// per parameter gradient that backward kernels write into, and update temporaries (u, v)
// live in update-scoped roots. Finalize() resolves every node's offset from the root and
// checks the tree; Allocate()/AttachExternal() bind the root to memory and fire each
// node's bind callbacks, Release() detaches (callbacks get nullptr) while all metadata stays.
//
// Alignment rules: a root's storage starts on a 64-byte boundary (kRootAlignment) and is
// zero-filled by Allocate; a child's byte offset must be a multiple of its dtype size (so
// every view is naturally aligned); automatic offsets place a child after its previous
// sibling, rounded up to max(dtype size, requested alignment). Siblings may not overlap
// unless added as aliases (View::kAlias), and no child may extend past its parent.
//
//   DataNode root("W");                                         // size from children
//   DataNode& lin = root.AddChild("linear", DType::kBF16, {6, 4});
//   DataNode& q = root.AddChild("q", DType::kBF16, {6, 4});     // packed projection
//   DataNode& h0 = q.AddChild("h0", DType::kBF16, {2, 4}, 0);  // head 0 = rows 0..1 of q
//   root.Finalize();
//   root.Allocate(&account, "weights");
//   bf16* p = h0.data_as<bf16>();                               // == q.data_as<bf16>()
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sshsdp/base/memory_account.h"
#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

// x rounded up to a multiple of m (m > 0).
constexpr size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

class DataNode {
 public:
  static constexpr size_t kAuto = static_cast<size_t>(-1);
  static constexpr size_t kRootAlignment = 64;
  enum class View { kExclusive, kAlias };
  using BindCallback = std::function<void(void* data)>;

  // A root. `bytes` = 0 sizes it at Finalize to cover its children (rounded up to 64).
  explicit DataNode(std::string name, size_t bytes = 0);
  ~DataNode();
  DataNode(const DataNode&) = delete;
  DataNode& operator=(const DataNode&) = delete;

  // Adds a child view of `shape` elements of `dtype` at `byte_offset` inside this node
  // (kAuto: after the previous child). Throws LayoutError once finalized, on a negative
  // dimension or a misaligned offset. The returned reference stays valid for the tree's life.
  DataNode& AddChild(std::string name, DType dtype, std::vector<int64_t> shape,
                     size_t byte_offset = kAuto, size_t align = 0, View view = View::kExclusive);

  // Root only: resolves offsets of the whole tree, sizes the root if needed, and checks
  // overlap and range of every node. Throws LayoutError naming the nodes at fault.
  void Finalize();

  // Root only: allocates zero-filled, 64-byte aligned storage and binds every node.
  // `account`/`category` (optional) record the bytes.
  void Allocate(MemoryAccount* account = nullptr, std::string category = "");
  // Root only: binds to memory owned elsewhere (e.g. a registered MPI window). `base` must
  // be 64-byte aligned and hold at least bytes(). Re-attaching a different base while bound
  // is an error (a detected binding change); Release first.
  void AttachExternal(void* base, size_t bytes);
  // Root only: unbinds (frees owned storage); callbacks receive nullptr.
  void Release();

  // Called with the node's data pointer on every bind and nullptr on every release; called
  // at once if the tree is bound already.
  void OnBind(BindCallback cb);

  const std::string& name() const { return name_; }
  std::string path() const;  // "root/child/grandchild"
  bool is_root() const { return parent_ == nullptr; }
  DataNode* parent() const { return parent_; }
  const DataNode& root() const;
  const std::vector<std::unique_ptr<DataNode>>& children() const { return children_; }
  DataNode* FindChild(const std::string& name) const;

  size_t numel() const;
  size_t bytes() const { return bytes_; }
  size_t offset() const { return offset_; }            // bytes from the parent's start
  size_t root_offset() const { return root_offset_; }  // bytes from the root's start
  bool finalized() const;
  bool bound() const;
  bool owns_storage() const { return is_root() && owned_ != nullptr; }

  void* data() const;  // nullptr when unbound
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

 private:
  DataNode(std::string name, DataNode* parent, DType dtype, std::vector<int64_t> shape,
           size_t offset, size_t align, View view);
  void Resolve(size_t root_offset);
  void Check() const;
  void FireBind(void* base);

  std::string name_;
  DataNode* parent_ = nullptr;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  size_t bytes_ = 0;
  size_t offset_ = 0;
  size_t align_ = 1;
  View view_ = View::kExclusive;
  size_t root_offset_ = 0;
  size_t next_auto_ = 0;
  std::vector<std::unique_ptr<DataNode>> children_;
  std::vector<BindCallback> callbacks_;

  // Root state.
  bool root_sized_from_children_ = false;
  bool finalized_ = false;
  void* base_ = nullptr;
  void* owned_ = nullptr;
  size_t owned_bytes_ = 0;
  MemoryAccount* account_ = nullptr;
  std::string category_;
};

}  // namespace sshsdp
