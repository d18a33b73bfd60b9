// A ring of loss sums on a model's backend (loss_ring.h).
#include "sshsdp/models/loss_ring.h"

#include <utility>

namespace sshsdp {

LossRing::LossRing(Backend& b) : b_(b), sums_(b) {
  const double zero = 0.0;  // Mean() before any forward
  b_.CopyIn(sums_.Reserve<double>(1 + kSlots), &zero, sizeof(double));
}

double LossRing::Mean(int64_t tokens) const {
  double sum = 0.0;
  b_.CopyOut(&sum, sums_.data<double>(), sizeof(double));
  return sum / static_cast<double>(tokens);
}

// The reads land in a local buffer first: a read that throws leaves what is kept as it was.
void LossRing::Keep(int64_t tokens) {
  double* sums = sums_.data<double>();
  if (static_cast<int>(kept_.size()) == kSlots) {  // the ring is full: read it back
    double ring[kSlots];
    b_.CopyOut(ring, sums + 1, sizeof(ring));
    for (int i = 0; i < kSlots; ++i)
      read_back_.push_back(ring[i] / static_cast<double>(kept_[static_cast<size_t>(i)]));
    kept_.clear();
  }
  b_.Copy(sums + 1 + kept_.size(), sums, sizeof(double));
  kept_.push_back(tokens);
}

std::vector<double> LossRing::Take() {
  std::vector<double> fresh(kept_.size());
  if (!fresh.empty())  // nothing kept: no wait
    b_.CopyOut(fresh.data(), sums_.data<double>() + 1, fresh.size() * sizeof(double));
  std::vector<double> out = std::exchange(read_back_, {});
  for (size_t i = 0; i < fresh.size(); ++i) out.push_back(fresh[i] / static_cast<double>(kept_[i]));
  kept_.clear();
  return out;
}

}  // namespace sshsdp
