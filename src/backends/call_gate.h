// call_gate.h (private): the coordinator backends' call timing: deadlines on the steady clock
// (the project's one time seam), and one call at a time on a connection, waited for with a
// timeout that counts against the call's own deadline.
//
// A mutex plus a condition variable rather than std::timed_mutex: glibc implements
// try_lock_until with pthread_mutex_clocklock, which this toolchain's ThreadSanitizer does not
// intercept (it then reports every unlock as an unlock of an unlocked mutex).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "sluice/clock.h"

namespace sluice::backend_detail {

// A deadline that never comes (a timeout too large to add to now).
constexpr Nanos kNoDeadline = Nanos::max();

inline Nanos mono_now() { return SteadyClock::instance().now(); }

inline Nanos deadline_after(Nanos timeout) {
  const Nanos now = mono_now();
  return timeout >= kNoDeadline - now ? kNoDeadline : now + timeout;
}

class CallGate {
 public:
  // Waits until the gate is free or `timeout` has passed (a timeout of a year or more: no
  // limit); true if this caller now holds it.
  [[nodiscard]] bool enter(std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mu_);
    if (timeout >= std::chrono::hours(24 * 365))
      free_.wait(lock, [&] { return !busy_; });
    else if (!free_.wait_for(lock, timeout, [&] { return !busy_; }))
      return false;
    busy_ = true;
    return true;
  }
  void leave() noexcept {
    {
      const std::lock_guard lock(mu_);
      busy_ = false;
    }
    free_.notify_one();
  }

  // Holds the gate for a scope (when entered).
  class Hold {
   public:
    Hold(CallGate& gate, std::chrono::nanoseconds timeout)
        : gate_(gate), held_(gate.enter(timeout)) {}
    ~Hold() {
      if (held_) gate_.leave();
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    [[nodiscard]] bool held() const noexcept { return held_; }

   private:
    CallGate& gate_;
    bool held_;
  };

 private:
  std::mutex mu_;
  std::condition_variable free_;
  bool busy_ = false;
};

}  // namespace sluice::backend_detail
