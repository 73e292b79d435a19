// throttler_client.h: the client side of the collaborative throttler, for batch jobs that work
// in chunks and ask `sluice serve` (or any Vitess- or freno-shaped throttler) before each one.
//
// What it is:
//   - ThrottlerClient::check(): one GET /throttler/check?app=A[&shard=S][&scope=..][&p=low]
//     over HTTP (a fresh connection per check, bounded by `timeout`). 200 is "go ahead"; 429,
//     417, 404 and 400 are "hold back" (with the body's reason, value and threshold). When the
//     throttler cannot be asked -- no answer, a 5xx, an answer that is not its JSON -- the
//     answer is `unreachable` and `ok` is the client's choice, OnUnreachable::kHold by default:
//     the database the throttler protects may well be why it does not answer, and a job that
//     presses on then is the load nobody can stop. kProceed is for jobs whose load is harmless.
//   - wait_until_allowed(): checks; on a refusal sleeps with bounded exponential backoff (1 s,
//     2 s, 4 s, 4 s... each times a uniform jitter factor in [1 - jitter, 1 + jitter]), never
//     less than `min_interval` (checking faster than the throttler samples learns nothing), and
//     never past the total deadline; returns the first allowed answer or, at the deadline, the
//     last refusal.
//   - run_in_chunks(): wait_until_allowed() before each chunk, then the chunk; the chunk
//     returns true while work remains. The backoff starts over after every allowed check.
// The clock, sleep and random draw are injectable (WaitHooks), so a test runs without sleeping.
//
// Use:
//   sluice::ThrottlerClientOptions o;
//   o.url = "http://127.0.0.1:8080";
//   o.app = "purge";
//   auto throttler = sluice::ThrottlerClient::create(o);
//   if (!throttler.ok()) { ...throttler.status()... }
//   const sluice::ChunkStats s = sluice::run_in_chunks(
//       [&] { return throttler.value().check(); }, [&] { return delete_100_rows() == 100; },
//       std::chrono::minutes(10));
//   if (!s.completed) { ...gave up: s.last.reason... }
//
// Thread-safety: a ThrottlerClient is immutable; check() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "sluice/core/clock.h"
#include "sluice/core/status.h"

namespace sluice {

struct ThrottlerAnswer {
  bool ok = false;     // go ahead with one chunk of work
  int status = 0;      // the HTTP status; 0 when no answer came
  std::string reason;  // the body's reason ("ok", "threshold_exceeded", ...) or "unreachable: .."
  bool unreachable = false;
  double value = 0;  // the deciding metric's value and threshold, when the body says
  double threshold = 0;
  std::string metric;
  std::string message;
};

enum class OnUnreachable { kHold, kProceed };

struct ThrottlerClientOptions {
  std::string url;    // the server's HTTP base: http://host[:port] (no TLS)
  std::string app;    // required
  std::string shard;  // empty: the server's first throttler
  std::string scope;  // "", "self" or "shard"
  bool low_priority = false;
  Nanos timeout = std::chrono::seconds(1);
  OnUnreachable on_unreachable = OnUnreachable::kHold;
};

class ThrottlerClient {
 public:
  // kInvalidArgument naming the option that is wrong (url, app, scope, timeout).
  [[nodiscard]] static StatusOr<ThrottlerClient> create(ThrottlerClientOptions options);
  [[nodiscard]] ThrottlerAnswer check() const;
  [[nodiscard]] const ThrottlerClientOptions& options() const noexcept { return options_; }

 private:
  explicit ThrottlerClient(ThrottlerClientOptions options) : options_(std::move(options)) {}
  ThrottlerClientOptions options_;
  std::string host_;  // from the url, parsed once by create()
  int port_ = 80;
  std::string target_;  // the check's path and query
};

// Reads an answer from a status and a body (the JSON of /throttler/check; freno's too).
[[nodiscard]] ThrottlerAnswer throttler_answer(int status, const std::string& body,
                                               OnUnreachable on_unreachable);

struct ThrottleBackoff {
  Nanos initial = std::chrono::seconds(1);
  double factor = 2;
  Nanos cap = std::chrono::seconds(4);
  double jitter = 0.2;  // in [0, 1)
  Nanos min_interval = std::chrono::milliseconds(100);
};
// Why `b` is unusable; empty when it is fine.
[[nodiscard]] std::string backoff_error(const ThrottleBackoff& b);
// The sleep after the `refusals`-th refusal in a row (1-based), `draw` uniform in [0, 1).
[[nodiscard]] Nanos backoff_delay(const ThrottleBackoff& b, unsigned refusals, double draw);

struct WaitHooks {
  std::function<Nanos()> now;        // default: the steady clock
  std::function<void(Nanos)> sleep;  // default: std::this_thread::sleep_for
  std::function<double()> random;    // default: a uniform draw in [0, 1)
  std::function<void(const ThrottlerAnswer&, Nanos)> on_wait;  // before each sleep
};

struct WaitResult {
  bool allowed = false;
  ThrottlerAnswer last;
  std::uint64_t checks = 0;
  std::uint64_t refusals = 0;
  Nanos waited{0};
};
// Checks until allowed or `deadline` (from now) passes.
[[nodiscard]] WaitResult wait_until_allowed(const std::function<ThrottlerAnswer()>& check,
                                            Nanos deadline, const ThrottleBackoff& backoff = {},
                                            const WaitHooks& hooks = {});

struct ChunkStats {
  bool completed = false;  // the chunk said no work remains; false: a wait hit its deadline
  std::uint64_t chunks = 0;
  std::uint64_t checks = 0;
  std::uint64_t refusals = 0;
  Nanos waited{0};
  double max_value = 0;  // the largest deciding value any check reported
  ThrottlerAnswer last;  // the last check's answer
};
[[nodiscard]] ChunkStats run_in_chunks(const std::function<ThrottlerAnswer()>& check,
                                       const std::function<bool()>& chunk, Nanos deadline_per_chunk,
                                       const ThrottleBackoff& backoff = {},
                                       const WaitHooks& hooks = {});

}  // namespace sluice
