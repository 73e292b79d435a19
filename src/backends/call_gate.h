// call_gate.h (private): one call at a time on a coordinator's connection, waited for with a
// timeout that counts against the call's own deadline.
//
// A mutex plus a condition variable rather than std::timed_mutex: glibc implements
// try_lock_until with pthread_mutex_clocklock, which this toolchain's ThreadSanitizer does not
// intercept (it then reports every unlock as an unlock of an unlocked mutex).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace sluice::backend_detail {

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
