// epoch_min.h: a minimum over the last one to two epochs (a windowed minimum that ages out).
//
// What it is: the no-load-RTT baseline filter used by VegasLimit and Gradient2Limit. It keeps
// the minimum of the current epoch and of the previous one; rotate() ends the current epoch,
// so a value is forgotten after two rotations. A low RTT therefore lowers the baseline at once,
// and a baseline that no longer matches the backend (it got slower, or the low value was a
// fluke) rises to the newer evidence within two epochs, with live traffic still flowing: no
// drain, no limit reset, no idle period needed. A single sample never replaces the baseline
// on its own; only a whole epoch of evidence does.
//
// Invariant: get() == min(samples added since the rotation before the last one); infinity
// when none.
//
// Thread-safety: none (a value type owned by one algorithm). No allocation.
#pragma once

#include <algorithm>
#include <limits>

namespace sluice {

class EpochMin {
 public:
  static constexpr double kEmpty = std::numeric_limits<double>::infinity();

  // Adds a sample; true if it lowered get() (the first sample always does).
  bool add(double v) noexcept {
    const bool lowered = v < get();
    cur_ = std::min(cur_, v);
    return lowered;
  }
  // Ends the current epoch: the previous epoch's minimum is forgotten.
  void rotate() noexcept {
    prev_ = cur_;
    cur_ = kEmpty;
  }
  [[nodiscard]] double get() const noexcept { return std::min(prev_, cur_); }
  [[nodiscard]] bool empty() const noexcept { return get() == kEmpty; }

 private:
  double prev_ = kEmpty;
  double cur_ = kEmpty;
};

}  // namespace sluice
