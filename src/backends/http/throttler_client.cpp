// throttler_client.h: the throttler's check over HTTP, the backoff, the wait and the chunked job.
#include "sluice/backends/throttler_client.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>

#include "backends/http/http_client.h"

namespace sluice {
namespace {

Status invalid(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

ThrottlerAnswer unreachable(std::string why, int status, OnUnreachable on) {
  ThrottlerAnswer a;
  a.status = status;
  a.unreachable = true;
  a.ok = on == OnUnreachable::kProceed;
  a.reason = "unreachable: " + std::move(why);
  return a;
}

// What a refusal means when the body does not say.
std::string reason_of_status(int status) {
  switch (status) {
    case 200:
      return "ok";
    case 400:
      return "bad_request";
    case 404:
      return "not_found";
    case 417:
      return "app_throttled";
    case 429:
      return "threshold_exceeded";
    default:
      return "status_" + std::to_string(status);
  }
}

}  // namespace

ThrottlerAnswer throttler_answer(int status, const std::string& body, OnUnreachable on) {
  if (status >= 500)
    return unreachable("the throttler answered " + std::to_string(status), status, on);
  ThrottlerAnswer a;
  a.status = status;
  a.ok = status == 200;
  a.reason = reason_of_status(status);
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object()) {
    // A HEAD-only or freno-style throttler may send no JSON: the status is the answer, unless
    // the body is something else entirely (a proxy's page) on a 200.
    if (!body.empty() && status == 200)
      return unreachable("the answer is not the throttler's JSON", status, on);
    return a;
  }
  const auto text = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const auto number = [&](const char* key, const char* other) {
    for (const char* k : {key, other}) {
      const auto it = j.find(k);
      if (it != j.end() && it->is_number()) return it->get<double>();
    }
    return 0.0;
  };
  if (std::string r = text("reason"); !r.empty()) a.reason = std::move(r);
  a.value = number("value", "Value");
  a.threshold = number("threshold", "Threshold");
  a.metric = text("MetricName");
  a.message = text("Message");
  return a;
}

StatusOr<ThrottlerClient> ThrottlerClient::create(ThrottlerClientOptions options) {
  backend_detail::HttpUrl url;
  if (std::string e = backend_detail::parse_http_url(options.url, url); !e.empty())
    return invalid("url: " + e);
  if (options.app.empty()) return invalid("app: must name the app that checks");
  if (options.scope != "" && options.scope != "self" && options.scope != "shard")
    return invalid("scope: must be self or shard, not '" + options.scope + "'");
  if (options.timeout <= Nanos{0}) return invalid("timeout: must be > 0");
  ThrottlerClient c(std::move(options));
  c.host_ = url.host;
  c.port_ = url.port;
  std::string base = url.target == "/" ? "" : url.target;
  if (!base.empty() && base.back() == '/') base.pop_back();
  c.target_ = base + "/throttler/check?app=" + backend_detail::url_encode(c.options_.app);
  if (!c.options_.shard.empty())
    c.target_ += "&shard=" + backend_detail::url_encode(c.options_.shard);
  if (!c.options_.scope.empty()) c.target_ += "&scope=" + c.options_.scope;
  if (c.options_.low_priority) c.target_ += "&p=low";
  return c;
}

ThrottlerAnswer ThrottlerClient::check() const {
  backend_detail::HttpUrl url;
  url.host = host_;
  url.port = port_;
  const backend_detail::HttpAnswer a = backend_detail::http_request(
      url, "GET", target_, {"Accept: application/json"}, options_.timeout);
  if (!a.error.empty()) return unreachable(a.error, 0, options_.on_unreachable);
  return throttler_answer(a.status, a.body, options_.on_unreachable);
}

std::string backoff_error(const ThrottleBackoff& b) {
  if (b.initial <= Nanos{0}) return "initial: must be > 0";
  if (!(b.factor >= 1)) return "factor: must be >= 1";
  if (b.cap < b.initial) return "cap: must be >= initial";
  if (!(b.jitter >= 0 && b.jitter < 1)) return "jitter: must be in [0, 1)";
  if (b.min_interval < Nanos{0}) return "min_interval: must be >= 0";
  return {};
}

Nanos backoff_delay(const ThrottleBackoff& b, unsigned refusals, double draw) {
  double d = std::chrono::duration<double>(b.initial).count();
  const double cap = std::chrono::duration<double>(b.cap).count();
  for (unsigned i = 1; i < refusals && d < cap; ++i) d *= b.factor;
  d = std::min(d, cap) * (1 - b.jitter + 2 * b.jitter * std::clamp(draw, 0.0, 1.0));
  const auto out = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(d));
  return std::max(out, b.min_interval);
}

namespace {

// The hooks with their defaults filled in.
WaitHooks complete(const WaitHooks& h) {
  WaitHooks out = h;
  if (!out.now) out.now = [] { return SteadyClock::instance().now(); };
  if (!out.sleep) out.sleep = [](Nanos d) { std::this_thread::sleep_for(d); };
  if (!out.random) {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    auto mu = std::make_shared<std::mutex>();
    out.random = [rng, mu] {
      const std::lock_guard lock(*mu);
      return std::uniform_real_distribution<double>(0, 1)(*rng);
    };
  }
  return out;
}

WaitResult wait_with(const std::function<ThrottlerAnswer()>& check, Nanos deadline,
                     const ThrottleBackoff& backoff, const WaitHooks& h) {
  WaitResult r;
  const Nanos until = h.now() + deadline;
  for (;;) {
    r.last = check();
    ++r.checks;
    if (r.last.ok) {
      r.allowed = true;
      return r;
    }
    ++r.refusals;
    const Nanos now = h.now();
    if (now >= until) return r;
    const Nanos delay = std::min(
        backoff_delay(backoff, static_cast<unsigned>(r.refusals), h.random()), until - now);
    if (h.on_wait) h.on_wait(r.last, delay);
    h.sleep(delay);
    r.waited += delay;
  }
}

}  // namespace

WaitResult wait_until_allowed(const std::function<ThrottlerAnswer()>& check, Nanos deadline,
                              const ThrottleBackoff& backoff, const WaitHooks& hooks) {
  return wait_with(check, deadline, backoff, complete(hooks));
}

ChunkStats run_in_chunks(const std::function<ThrottlerAnswer()>& check,
                         const std::function<bool()>& chunk, Nanos deadline_per_chunk,
                         const ThrottleBackoff& backoff, const WaitHooks& hooks) {
  const WaitHooks h = complete(hooks);
  ChunkStats s;
  for (;;) {
    const WaitResult w = wait_with(
        [&] {
          ThrottlerAnswer a = check();
          s.max_value = std::max(s.max_value, a.value);
          return a;
        },
        deadline_per_chunk, backoff, h);
    s.checks += w.checks;
    s.refusals += w.refusals;
    s.waited += w.waited;
    s.last = w.last;
    if (!w.allowed) return s;
    ++s.chunks;
    if (!chunk()) {
      s.completed = true;
      return s;
    }
  }
}

}  // namespace sluice
