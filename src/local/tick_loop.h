// tick_loop.h: a thread that only delivers tick(now), for something that runs in the background
// (a fleet guard's heartbeats, a policy's escrow prefetch or probes).
//
// What it is: the thing that ticks is an explicit state machine: tick(now) does one round of
// work and returns when it wants the next one; the loop sleeps until then (on real time, the
// clock's now() is what it passes), or until wake() asks for a tick at once. A test drives the
// same machine by calling tick() itself with a ManualClock, with no loop at all.
//
// Invariants: tick is never called concurrently with itself; after stop() returns it is never
// called again. The first tick is due at once.
//
// Thread-safety: wake() from any thread; stop() from one thread at a time, never from inside
// tick (it joins).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "sluice/core/clock.h"

namespace sluice {

class TickLoop {
 public:
  // `clock` must outlive the loop.
  TickLoop(const Clock& clock, std::function<Nanos(Nanos now)> tick);
  ~TickLoop() { stop(); }
  TickLoop(const TickLoop&) = delete;
  TickLoop& operator=(const TickLoop&) = delete;

  // Asks for a tick now (coalesced: several wakes before the next tick make one tick).
  void wake() noexcept;
  // Stops and joins the thread. Idempotent (not concurrent with itself).
  void stop() noexcept;

 private:
  void run();

  const Clock& clock_;
  std::function<Nanos(Nanos)> tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool woken_ = false;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace sluice
