#include "local/tick_loop.h"

#include <algorithm>
#include <chrono>

namespace sluice {

TickLoop::TickLoop(const Clock& clock, std::function<Nanos(Nanos now)> tick)
    : clock_(clock), tick_(std::move(tick)), thread_([this] { run(); }) {}

void TickLoop::wake() noexcept {
  {
    const std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void TickLoop::stop() noexcept {
  {
    const std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TickLoop::run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    woken_ = false;
    lock.unlock();
    const Nanos next = tick_(clock_.now());
    lock.lock();
    // At most an hour at a time (a tick that wants none soon returns Nanos::max()).
    const Nanos wait = std::clamp(next - clock_.now(), Nanos{0}, Nanos{std::chrono::hours(1)});
    cv_.wait_for(lock, wait, [&] { return stop_ || woken_; });
  }
}

}  // namespace sluice
