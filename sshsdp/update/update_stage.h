// Unit-declared optimizer stages: F = [f0, f1, …] of the paper (§3.1, §3.2, appendix
// "Packing and compatibility"), each declaring its operands and how many elements of each
// operand one update unit needs.
//
// An UpdateProgram is an ordered list of UpdateStage over a set of update units (update_unit.h)
// and the fields it touches: persistent optimizer state kept at ZeRO-1 ("main", "grad", "m",
// "v": fp32 arrays over each rank's ZeRO-1 chunk, in the group's element layout) and
// temporaries that live only during the update (Muon's bf16 u and fp32 v). Every field is
// indexed like the update parameters' elements. Each operand declares its elements per unit:
// Extent::Elements(1) for elementwise work, Extent::Unit() for a whole unit matrix (or
// Elements(k) when every unit has k elements). Operands may differ in elements per unit, but
// all must describe the same number of units; ValidateProgram checks that, and that no stage
// reads a temporary before an earlier stage produced it (PlanError naming both).
//
// A stage whose operands are single elements is elementwise: it runs on local fragments only.
// Any other stage is a unit stage: a unit whose fragments lie on several ranks is executed on
// one of them after the missing input fragments arrive point to point (update_plan.h).
// Kernels receive a batch: every piece of an elementwise stage at once (one multi-tensor loop),
// or all units of one shape of a unit stage (batched GEMMs).
//
//   UpdateProgram p{"scale", {{"grad", DType::kF32, FieldRole::kState},
//                             {"u", DType::kF32, FieldRole::kTemporary}}, {}};
//   p.stages.push_back({"f0", {{"grad", Extent::Elements(1)}}, {{"u", Extent::Elements(1)}},
//                       {"grad_scale"}, nullptr,
//                       [](const StageBatch& b) { for (const StageItem& it : b.items) {...} }});
//   std::vector<StageKind> kinds = ValidateProgram(p, units);  // PlanError on a bad program
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sshsdp/numerics/dtype.h"
#include "sshsdp/update/update_unit.h"

namespace sshsdp {

// Elements of an operand that one unit of a stage covers.
struct Extent {
  enum class Kind { kElements, kUnit };
  Kind kind = Kind::kElements;
  int64_t elements = 1;  // kElements only
  static Extent Elements(int64_t k) { return {Kind::kElements, k}; }
  static Extent Unit() { return {Kind::kUnit, 0}; }
};

enum class FieldRole {
  kState,      // persistent fp32 ZeRO-1 array provided by the engine
  kTemporary,  // update-scoped allocation (data tree root per field), produced by a stage
};

struct FieldDecl {
  std::string name;
  DType dtype = DType::kF32;
  FieldRole role = FieldRole::kState;
};

struct Operand {
  std::string field;
  Extent per_unit;
};

// Named scalars shared by every rank (step, learning rates, gradient scale). Stages declare
// the names they read; the executor checks they are set before running.
class ScalarState {
 public:
  void Set(const std::string& name, double value) { values_[name] = value; }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // PlanError naming the scalar when it was never set.
  double Get(const std::string& name) const;

 private:
  std::map<std::string, double> values_;
};

// One piece of an elementwise batch or one whole unit of a unit batch.
struct StageItem {
  const UpdateUnit* unit = nullptr;  // the unit it belongs to
  size_t begin = 0;                  // first element (group element index) it covers
  int64_t numel = 0;
  std::vector<void*> data;  // one pointer per operand: the stage's inputs, then its outputs
};

struct UpdateStage;
struct StageBatch {
  const UpdateStage* stage = nullptr;
  const ScalarState* scalars = nullptr;
  int64_t rows = 0, cols = 0;  // unit stages: the shape shared by every item
  std::vector<StageItem> items;
};

using StageKernel = std::function<void(const StageBatch&)>;
// Work of one unit (e.g. Newton–Schulz FLOPs), for load balancing execution ranks.
using UnitCost = std::function<double(const UpdateUnit&)>;

struct UpdateStage {
  std::string name;
  std::vector<Operand> inputs;
  std::vector<Operand> outputs;  // a field may be both read and written (same pointer)
  std::vector<std::string> scalars;
  UnitCost cost;  // unit stages; nullptr: the unit's element count
  StageKernel kernel;
};

struct UpdateProgram {
  std::string name;
  std::vector<FieldDecl> fields;
  std::vector<UpdateStage> stages;
  const FieldDecl* Field(const std::string& name) const;  // nullptr when undeclared
};

enum class StageKind { kElementwise, kUnit };

// The memory-account category of update-scoped allocations (Muon's temporaries, gathered
// matrices of the full-tensor path).
inline constexpr const char* kUpdateTemporaries = "update_temporaries";

// Checks `program` over `units` before anything runs (paper Table 4) and returns the kind of
// every stage. PlanError, naming program, stage and operand, when: an operand's field is not
// declared; a state field is not fp32; a stage reads a temporary that no earlier stage
// produced; operands disagree on the number of units; a unit stage's operand declares
// Elements(k) with k different from some unit's size; a stage has no kernel or no operand.
std::vector<StageKind> ValidateProgram(const UpdateProgram& program,
                                       const std::vector<UpdateUnit>& units);

}  // namespace sshsdp
