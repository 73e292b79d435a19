// The host's own probes (load average, a command's number) and what every probe shares.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "backends/http/http_client.h"
#include "backends/probes/probe.h"
#include "backends/probes/registry.h"

namespace sluice::probes {

namespace {

// Closes every descriptor from `first` on, in a forked child before exec (async-signal-safe:
// system calls only). close_range (Linux 5.9) in one call; else each up to the limit.
void close_from(int first) noexcept {
#if defined(SYS_close_range)
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, 0U) == 0) return;
#endif
  rlimit lim{};
  const rlim_t top =
      ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY ? lim.rlim_cur : 65536;
  for (rlim_t fd = static_cast<rlim_t>(first); fd < top; ++fd) ::close(static_cast<int>(fd));
}

}  // namespace

std::string Endpoint::name() const {
  backend_detail::HttpUrl u;
  u.host = host;
  u.port = port;
  return u.authority();
}

void sample_each(std::vector<ThrottleSample>& hosts, const std::vector<Endpoint>& endpoints,
                 const std::function<std::optional<double>(std::size_t, std::string&)>& measure) {
  hosts.resize(endpoints.size());
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    ThrottleSample& s = hosts[i];
    s.host = endpoints[i].name();
    std::string error;
    if (const std::optional<double> v = measure(i, error)) {
      s.value = *v;
      s.error.clear();
    } else {
      s.error = std::move(error);
    }
  }
}

bool leading_number(const std::string& text, double& value, std::string& word) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    word.clear();
    return false;
  }
  const auto last = text.find_first_of(" \t\r\n", first);
  word = text.substr(first, last == std::string::npos ? std::string::npos : last - first);
  double v = 0;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
  if (ec != std::errc{} || end != word.data() + word.size() || !std::isfinite(v)) return false;
  value = v;
  return true;
}

namespace {

// The host's 1-minute load average, from /proc/loadavg.
class LoadAvgProbe final : public Probe {
 public:
  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = "self";
    std::ifstream in("/proc/loadavg");
    double v = 0;
    if (in >> v && std::isfinite(v)) {
      s.value = v;
      s.error.clear();
    } else {
      s.error = "cannot read /proc/loadavg";
    }
  }
};

// A command's number: `/bin/sh -c command`, its standard output's first word, within
// `timeout` (past it the command's process group is killed). Its own process group, standard
// input from /dev/null, standard error discarded.
class CommandProbe final : public Probe {
 public:
  CommandProbe(std::string command, Nanos timeout)
      : command_(std::move(command)), timeout_(timeout) {}

  // The running command is killed within kCancelPoll.
  void cancel() noexcept override { cancelled_.store(true, std::memory_order_relaxed); }

  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = "self";
    std::string error;
    const std::optional<double> v = run(error);
    if (v) {
      s.value = *v;
      s.error.clear();
    } else {
      s.error = std::move(error);
    }
  }

 private:
  static constexpr std::int64_t kCancelPoll = 50;  // ms between looks at cancelled_

  std::optional<double> run(std::string& error) const {
    if (cancelled_.load(std::memory_order_relaxed)) {
      error = "cancelled: the policy is retiring";
      return std::nullopt;
    }
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      error = "pipe: " + std::string(std::strerror(errno));
      return std::nullopt;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      error = "fork: " + std::string(std::strerror(errno));
      ::close(out[0]);
      ::close(out[1]);
      return std::nullopt;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, STDIN_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      // Nothing else of the server's goes with the command: a listening socket a child kept
      // would outlive a crash of the server (clients would connect and hang, and a restart on
      // the same ports would fail), whoever opened it and with whatever flags.
      close_from(STDERR_FILENO + 1);
      ::execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // as the child does: whichever runs first
    ::close(out[1]);
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    bool timed_out = false, cancelled = false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      if (cancelled_.load(std::memory_order_relaxed)) {
        cancelled = true;
        break;
      }
      pollfd p{out[0], POLLIN, 0};
      const int ready =
          ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), kCancelPoll)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // end of output
      if (text.size() < 4096) text.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    if (timed_out || cancelled) ::kill(-pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (cancelled) {
      error = "cancelled: the policy is retiring";
      return std::nullopt;
    }
    if (timed_out) {
      error = "command did not finish within " +
              std::to_string(std::chrono::duration<double>(timeout_).count()) + "s";
      return std::nullopt;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      error = WIFEXITED(status)
                  ? "command exited with " + std::to_string(WEXITSTATUS(status))
                  : "command was killed by signal " + std::to_string(WTERMSIG(status));
      return std::nullopt;
    }
    double v = 0;
    std::string word;
    if (!leading_number(text, v, word)) {
      error = "command printed '" + word.substr(0, 64) + "', not a number";
      return std::nullopt;
    }
    return v;
  }

  const std::string command_;
  const Nanos timeout_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

std::unique_ptr<Probe> loadavg_probe() { return std::make_unique<LoadAvgProbe>(); }
std::unique_ptr<Probe> command_probe(std::string command, Nanos timeout) {
  return std::make_unique<CommandProbe>(std::move(command), timeout);
}

void add_host_probes(ProbeRegistry& r) {
  r.add({"loadavg", {}, [](ProbeSettings& /*s*/, const ProbeContext& /*c*/) -> MakeProbe {
           return [](const ProbeEnv&) { return loadavg_probe(); };
         }});
  r.add(
      {"command", {"command", "timeout"}, [](ProbeSettings& s, const ProbeContext& c) -> MakeProbe {
         std::string command = s.str("command", true).value_or("");
         if (s.has("command") && command.empty()) s.error("command", "must not be empty");
         return [command, timeout = c.timeout](const ProbeEnv&) {
           return command_probe(command, timeout);
         };
       }});
}

}  // namespace sluice::probes
