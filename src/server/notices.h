// notices.h (private): what a policy has to tell the operator while it serves (a federated
// budget the coordinator holds under another region's spec), for the server's log.
//
// A policy tells a line from any thread; the server takes the lines from its own thread and
// logs them. At most kMax lines wait: beyond that a line is counted, not kept, and the next
// take() says how many were dropped. Thread-safe.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sluice::server {

class Notices {
 public:
  static constexpr std::size_t kMax = 256;

  void tell(std::string line) {
    const std::lock_guard lock(mu_);
    if (lines_.size() >= kMax) {
      ++dropped_;
      return;
    }
    lines_.push_back(std::move(line));
  }

  // The lines told since the last take, oldest first.
  [[nodiscard]] std::vector<std::string> take() {
    std::vector<std::string> out;
    std::size_t dropped = 0;
    {
      const std::lock_guard lock(mu_);
      out.swap(lines_);
      dropped = std::exchange(dropped_, 0);
    }
    if (dropped > 0)
      out.push_back(std::to_string(dropped) + " more line(s) of this kind were not logged");
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
  std::size_t dropped_ = 0;
};

}  // namespace sluice::server
