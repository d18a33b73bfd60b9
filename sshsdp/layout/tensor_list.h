// TensorList: member tensors of one field and one dtype packed into one flat buffer.
//
// The paper's tensor list W = [w0, …, wk]: each member has a shape and an element offset;
// members are packed back to back (optionally each start aligned to `align` elements, for
// layouts that align shards to update units), and only the buffer TAIL is padded, to a
// multiple of the shard count, so every ZeRO level cuts it into equal chunks. Individual
// tensors are never padded.
//
//   TensorList w("block0.w", DType::kBF16);
//   int lin = w.Add("linear", {6, 4});
//   int h0 = w.Add("q.h0", {2, 4});
//   w.Finalize(/*pad_multiple=*/4);
//   w.member(h0).offset;   // 24 (elements)
//   w.padded_numel();      // multiple of 4
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sshsdp/numerics/dtype.h"

namespace sshsdp {

struct TensorListMember {
  std::string name;
  std::vector<int64_t> shape;
  size_t numel = 0;
  size_t offset = 0;  // first element in the flat buffer
  size_t end() const { return offset + numel; }
};

class TensorList {
 public:
  TensorList() : TensorList("", DType::kF32) {}
  TensorList(std::string name, DType dtype);

  // Appends a member; its offset is the previous end rounded up to `align` elements.
  // Throws LayoutError after Finalize, on a non-positive dimension or a duplicate name.
  int Add(std::string name, std::vector<int64_t> shape, size_t align = 1);

  // Pads the tail so padded_numel() is a multiple of `pad_multiple` (> 0) and freezes
  // the list.
  void Finalize(size_t pad_multiple);

  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  bool finalized() const { return finalized_; }
  size_t num_members() const { return members_.size(); }
  const TensorListMember& member(size_t i) const { return members_.at(i); }
  const std::vector<TensorListMember>& members() const { return members_; }
  // Index of a member by name, or -1.
  int Find(const std::string& name) const;

  size_t numel() const { return numel_; }                // end of the last member
  size_t padded_numel() const { return padded_numel_; }  // after tail padding
  size_t padded_bytes() const { return padded_numel_ * DTypeSize(dtype_); }

 private:
  std::string name_;
  DType dtype_;
  std::vector<TensorListMember> members_;
  size_t numel_ = 0;
  size_t padded_numel_ = 0;
  bool finalized_ = false;
};

// Product of dimensions.
size_t NumElements(const std::vector<int64_t>& shape);
// "[3, 4]".
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace sshsdp
