// epoch_min.h: a minimum over the last one to two epochs (a windowed minimum that ages out).
// Internal (src/core): the public headers never name it.
//
// What it is: the no-load-RTT baseline filter used by VegasLimit and Gradient2Limit. It keeps
// the minimum of the current epoch and of the previous one; rotate() ends the current epoch,
// so a value is forgotten after two rotations. A low RTT therefore lowers the baseline at once,
// and a baseline that no longer matches the backend (it got slower, or the low value was a
// fluke) rises to the newer evidence within two epochs, with live traffic still flowing: no
// drain, no limit reset, no idle period needed. A single sample never replaces the baseline
// on its own; only a whole epoch of evidence does.
//
// Where the state lives: the owner keeps it as two plain doubles, the previous and the current
// epoch's minimum, each initialised to kEpochMinEmpty (so its public header needs neither this
// type nor this file). EpochMin is a view over references to those two doubles: a view over
// `double`s reads and updates them in place (add, rotate); one over `const double`s, which
// class template argument deduction picks inside a const member function, only reads them
// (get, empty). There is no copy to store back, so no second copy of the state can drift.
//
// Invariant (when the state starts as kEpochMinEmpty, kEpochMinEmpty and changes only through
// views): get() == min(samples added since the rotation before the last one); infinity when
// none.
//
// Thread-safety: none (the state belongs to one algorithm). No allocation. A view must not
// outlive the doubles it refers to; make one where it is used.
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>

namespace sluice {

// The minimum of an epoch with no samples yet.
inline constexpr double kEpochMinEmpty = std::numeric_limits<double>::infinity();

// Double is `double` (reads and updates) or `const double` (reads only).
template <typename Double>
class EpochMin {
  static_assert(std::is_same_v<std::remove_const_t<Double>, double>);

 public:
  // `prev` and `cur` are the previous and the current epoch's minimum.
  EpochMin(Double& prev, Double& cur) noexcept : prev_(prev), cur_(cur) {}

  // Adds a sample; true if it lowered get() (the first sample always does).
  bool add(double v) noexcept requires(!std::is_const_v<Double>) {
    const bool lowered = v < get();
    cur_ = std::min(cur_, v);
    return lowered;
  }
  // Ends the current epoch: the previous epoch's minimum is forgotten.
  void rotate() noexcept requires(!std::is_const_v<Double>) {
    prev_ = cur_;
    cur_ = kEpochMinEmpty;
  }
  [[nodiscard]] double get() const noexcept { return std::min(prev_, cur_); }
  [[nodiscard]] bool empty() const noexcept { return get() == kEpochMinEmpty; }

 private:
  Double& prev_;
  Double& cur_;
};

}  // namespace sluice
