// io_pool.h (private): a few threads that run coordinator calls off the callers' threads.
//
// What it is: an IoExecutor (sluice/federation/federation.h) backed by `threads` workers and one
// FIFO. A call blocks its worker for at most its own timeout, so `threads` bounds how many
// coordinator calls are in flight at once. The destructor runs what is queued, then joins.
//
// Thread-safety: executor() may be called from any thread; its tasks run on the workers.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/federation/federation.h"

namespace sluice {

class IoPool {
 public:
  explicit IoPool(std::size_t threads) {
    for (std::size_t i = 0; i < std::max<std::size_t>(1, threads); ++i)
      workers_.emplace_back([this] { work(); });
  }
  ~IoPool() {
    {
      const std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  [[nodiscard]] IoExecutor executor() {
    return [this](std::function<void()> task) {
      {
        const std::lock_guard lock(mu_);
        queue_.push_back(std::move(task));
      }
      cv_.notify_one();
    };
  }

 private:
  void work() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace sluice
