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
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>

#include "sluice/core/clock.h"
#include "sluice/core/status.h"

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
  // Whether someone holds the gate now (a hint: it may change at once).
  [[nodiscard]] bool busy() const {
    const std::lock_guard lock(mu_);
    return busy_;
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
  mutable std::mutex mu_;
  std::condition_variable free_;
  bool busy_ = false;
};

// Runs `body()` holding `gate` (waited for at most `timeout`) and returns what it returns, a
// Status or a StatusOr<T>. Never throws: a gate still busy after `timeout` yields
// kDeadlineExceeded with `busy_message`; an exception out of `body` first calls `on_throw()`
// (where a connection left mid-protocol is dropped) and yields kInternal, "out of memory" or
// the exception's text after `prefix`.
template <typename F, typename G>
std::invoke_result_t<F&> call_holding(CallGate& gate, std::chrono::nanoseconds timeout,
                                      const char* busy_message, const char* prefix, F&& body,
                                      G&& on_throw) noexcept {
  try {
    const CallGate::Hold hold(gate, timeout);
    if (!hold.held()) return Status(StatusCode::kDeadlineExceeded, busy_message);
    try {
      return body();
    } catch (...) {
      on_throw();
      throw;
    }
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kInternal, "out of memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string(prefix) + e.what());
  }
}

}  // namespace sluice::backend_detail
