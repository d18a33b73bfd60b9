// Model-interface helpers: spec validation, deterministic initialisation, dense reference
// parameters (see model.h).
#include "sshsdp/params/model.h"

#include <cmath>
#include <numbers>

#include "sshsdp/base/error.h"
#include "sshsdp/kernels/elementwise.h"

namespace sshsdp {
namespace {

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

}  // namespace

int64_t UpdatePart::numel() const { return Product(shape); }
int64_t RuntimeParamSpec::numel() const { return Product(shape); }

void MatrixView(const std::vector<int64_t>& shape, int64_t* rows, int64_t* cols) {
  if (shape.empty()) {
    *rows = *cols = 1;
    return;
  }
  *cols = shape.back();
  *rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) *rows *= shape[i];
}

void ValidateSpec(const RuntimeParamSpec& spec) {
  int64_t next = 0;
  for (const UpdatePart& p : spec.parts) {
    SSHSDP_CHECK(p.offset == next, PlanError,
                 "runtime param '{}': update part '{}' starts at element {} but the previous "
                 "part ends at {} (parts must be contiguous, in order, non-overlapping)",
                 spec.name, p.name, p.offset, next);
    SSHSDP_CHECK(p.numel() > 0, PlanError, "runtime param '{}': update part '{}' is empty",
                 spec.name, p.name);
    next += p.numel();
  }
  SSHSDP_CHECK(next == spec.numel(), PlanError,
               "runtime param '{}': update parts cover {} of its {} elements", spec.name, next,
               spec.numel());
}

int64_t Model::NumParams() const {
  int64_t n = 0;
  for (int g = 0; g < num_groups(); ++g) {
    for (const RuntimeParamSpec& s : GroupParams(g)) n += s.numel();
  }
  return n;
}

bool Model::GroupConsumesMx(int g) const {
  bool any = false;
  for (const RuntimeParamSpec& s : GroupParams(g)) {
    for (const UpdatePart& p : s.parts) {
      if (p.kind == UpdateKind::kEmbedding) return false;
      any = true;
    }
  }
  return any;
}

void FillInit(const UpdatePart& part, uint64_t seed, int64_t begin, int64_t count, float* out) {
  SSHSDP_CHECK(begin >= 0 && count >= 0 && begin + count <= part.numel(), PlanError,
               "FillInit '{}': range [{}, {}) outside its {} elements", part.name, begin,
               begin + count, part.numel());
  switch (part.init.kind) {
    case InitSpec::Kind::kZeros:
      kernels::Fill(out, count, 0.0f);
      return;
    case InitSpec::Kind::kOnes:
      kernels::Fill(out, count, 1.0f);
      return;
    case InitSpec::Kind::kNormal:
      break;
  }
  const uint64_t key = SplitMix64(seed ^ HashName(part.name));
  const int64_t zero_from = part.init.zero_from;
  for (int64_t i = 0; i < count; ++i) {
    if (zero_from >= 0 && begin + i >= zero_from) {
      out[i] = 0.0f;
      continue;
    }
    uint64_t h = SplitMix64(key + static_cast<uint64_t>(begin + i) * 0xD1B54A32D192ED03ull);
    double u1 = (static_cast<double>(h >> 32) + 0.5) / 4294967296.0;
    double u2 = (static_cast<double>(h & 0xFFFFFFFFu) + 0.5) / 4294967296.0;
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    out[i] = static_cast<float>(z * part.init.std);
  }
}

DenseParams::DenseParams(const Model& model, DType weight_dtype, DType grad_dtype)
    : tied_(model.TiesFirstGroup()), weight_dtype_(weight_dtype), grad_dtype_(grad_dtype) {
  for (DType t : {weight_dtype, grad_dtype}) {
    SSHSDP_CHECK(t == DType::kF32 || t == DType::kBF16, ConfigError,
                 "DenseParams: dtype must be fp32 or bf16, got {}", DTypeName(t));
  }
  const int n = model.num_groups();
  specs_.resize(n);
  master_.resize(n);
  weights_.resize(n);
  grads_.resize(n);
  for (int g = 0; g < n; ++g) {
    specs_[g] = model.GroupParams(g);
    for (const RuntimeParamSpec& s : specs_[g]) {
      ValidateSpec(s);
      master_[g].emplace_back(s.numel(), 0.0f);
      weights_[g].emplace_back(s.numel() * DTypeSize(weight_dtype), 0);
      grads_[g].emplace_back(s.numel() * DTypeSize(grad_dtype), 0);
    }
  }
}

void DenseParams::Init(uint64_t seed) {
  for (size_t g = 0; g < specs_.size(); ++g) {
    for (size_t i = 0; i < specs_[g].size(); ++i) {
      for (const UpdatePart& p : specs_[g][i].parts) {
        FillInit(p, seed, 0, p.numel(), master_[g][i].data() + p.offset);
      }
    }
  }
  SyncWeights();
}

void DenseParams::SyncWeights() {
  for (size_t g = 0; g < specs_.size(); ++g) {
    for (size_t i = 0; i < specs_[g].size(); ++i) {
      kernels::WriteOrAccumulate(master_[g][i].data(), weights_[g][i].data(), weight_dtype_,
                                 specs_[g][i].numel(), false);
    }
  }
}

std::vector<TensorRef> DenseParams::Weights(int g) {
  std::vector<TensorRef> r;
  for (auto& w : weights_[g]) r.push_back(TensorRef{w.data(), weight_dtype_});
  return r;
}

std::vector<TensorRef> DenseParams::Grads(int g) {
  std::vector<TensorRef> r;
  for (auto& w : grads_[g]) r.push_back(TensorRef{w.data(), grad_dtype_});
  return r;
}

std::vector<TensorRef> DenseParams::WithTied(int g, std::vector<TensorRef> own,
                                             std::vector<TensorRef> (DenseParams::*views)(int)) {
  if (!tied_ || g != num_groups() - 1) return own;
  const std::vector<TensorRef> first = (this->*views)(0);
  own.insert(own.end(), first.begin(), first.end());
  return own;
}

std::vector<TensorRef> DenseParams::ModelWeights(int g) {
  return WithTied(g, Weights(g), &DenseParams::Weights);
}

std::vector<TensorRef> DenseParams::ModelGrads(int g) {
  return WithTied(g, Grads(g), &DenseParams::Grads);
}

GradWrite DenseParams::ModeOf(int g, GradWrite mode) const {
  return tied_ && g == 0 ? GradWrite::kAccumulate : mode;
}

std::vector<float> DenseParams::GradAsFloat(int g, int i) const {
  std::vector<float> out(specs_[g][i].numel());
  kernels::ToFloat(grads_[g][i].data(), grad_dtype_, out.data(), specs_[g][i].numel());
  return out;
}

}  // namespace sshsdp
