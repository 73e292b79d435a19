// The gateway queue as the server serves it (Engine::admit with a transport's Deferral): how
// close a queued call's wait comes to the bound that ends it, under load, against the same
// wait done by the operating system's own timer (std::this_thread::sleep_for) in the same run;
// and how long a release takes to hand its slot to the call at the head of the queue (until
// that call's answer is given to its transport), against the same release with nobody waiting.
//
// Load, in every benchmark of this file: 8 threads keep the measured upstream's queue busy
// (each admits there, waits out its timeout, and again) and 4 threads admit and release on a
// second queued upstream of 2 slots (every release a handoff). The policy's timer ticks every
// 2 ms while calls wait: that, plus scheduling, is what a wait can run over.
//
// A wait benchmark's time per operation is one call's whole wait, and its counters the
// percentiles of the overshoot (answer time minus the bound, microseconds) over the run; a
// release benchmark's, the release (with the handoff), and its counters that time's percentiles.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/ratio_main.h"
#include "server/engine.h"
#include "sluice/config/config.h"

namespace {

using sluice::Nanos;
using sluice::StatusOr;
using sluice::server::AdmitCall;
using sluice::server::AdmitResult;
using sluice::server::CallAttribute;
using sluice::server::CallResult;
using sluice::server::Engine;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kTimeout = milliseconds(20);  // the measured queue's timeout
constexpr auto kMaxWait = milliseconds(10);  // a call's own bound, below it

constexpr const char* kConfig = R"(
policies:
  gw:
    kind: concurrency
    tenants:
      - id: t
    upstreams:
      - id: full
        host: full.internal
        owner: t
        concurrency_limit:
          max_concurrent: 1
          strategy: queue
          queue: {max_depth: 1000, timeout: 20ms}
      - id: busy
        host: busy.internal
        owner: t
        concurrency_limit:
          max_concurrent: 2
          strategy: queue
          queue: {max_depth: 1000, timeout: 1s}
      - id: handoff
        host: handoff.internal
        owner: t
        concurrency_limit:
          max_concurrent: 1
          strategy: queue
          queue: {max_depth: 10, timeout: 10s}
)";

// One admit's answer, as a transport receives it.
class Answer final : public sluice::server::Deferral<AdmitResult> {
 public:
  sluice::server::Completion<AdmitResult> defer() override {
    return [this](StatusOr<AdmitResult> r) { set(std::move(r)); };
  }
  void set(StatusOr<AdmitResult> r) {
    {
      const std::lock_guard lock(mu_);
      at_ = Clock::now();
      result_.emplace(std::move(r));
    }
    cv_.notify_all();
  }
  StatusOr<AdmitResult> wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return result_.has_value(); });
    return std::move(*result_);
  }
  [[nodiscard]] Clock::time_point at() {
    const std::lock_guard lock(mu_);
    return at_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<StatusOr<AdmitResult>> result_;
  Clock::time_point at_;
};

StatusOr<AdmitResult> admit(Engine& e, const char* upstream,
                            std::optional<Nanos> max_wait = std::nullopt) {
  const CallAttribute at[] = {{"tenant", "t"}, {"upstream", upstream}};
  const AdmitCall c{.policy = "gw", .max_wait = max_wait, .attributes = at};
  Answer a;
  if (auto r = e.admit(c, a)) return std::move(*r);
  return a.wait();
}

// The engine, a held slot on `full` and `handoff`, and the load threads, for one benchmark.
class Loaded {
 public:
  Loaded() {
    sluice::ConfigLoad load =
        sluice::load_config(kConfig, sluice::server::PolicyRegistry::builtin());
    if (!load.config) {
      std::fprintf(stderr, "bench_queue: %s\n", load.errors.front().to_string("config").c_str());
      std::abort();
    }
    engine_ = std::move(Engine::create(*load.config, sluice::SteadyClock::instance()).value());
    full_ = admit(*engine_, "full").value().lease_id;  // the measured queue never has a slot
    for (int i = 0; i < 8; ++i)
      threads_.emplace_back([this] {
        while (!stop_.load()) (void)admit(*engine_, "full");
      });
    for (int i = 0; i < 4; ++i)
      threads_.emplace_back([this] {
        while (!stop_.load()) {
          auto r = admit(*engine_, "busy");
          if (r.ok() && r.value().admitted) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            (void)engine_->release(r.value().lease_id, CallResult::kSuccess, std::nullopt);
          }
        }
      });
  }
  ~Loaded() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
    (void)engine_->release(full_, CallResult::kSuccess, std::nullopt);
    engine_->close();
  }
  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<Engine> engine_;
  std::string full_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Overshoots (microseconds), reported as percentiles.
void report(benchmark::State& state, std::vector<double> over_us) {
  if (over_us.empty()) return;
  std::sort(over_us.begin(), over_us.end());
  const auto at = [&](double q) {
    return over_us[std::min(over_us.size() - 1, static_cast<std::size_t>(q * over_us.size()))];
  };
  state.counters["over_p50_us"] = at(0.5);
  state.counters["over_p99_us"] = at(0.99);
  state.counters["over_max_us"] = over_us.back();
}

double us_over(Clock::duration took, Clock::duration bound) {
  return std::chrono::duration<double, std::micro>(took - bound).count();
}

// The floor: the OS timer's own overshoot on the same wait, under the same load.
void sleep_floor(benchmark::State& state, Clock::duration bound) {
  Loaded load;
  std::vector<double> over;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(bound);
    over.push_back(us_over(Clock::now() - t0, bound));
  }
  report(state, std::move(over));
}

void BM_Floor_SleepFor20ms(benchmark::State& state) { sleep_floor(state, kTimeout); }
void BM_Floor_SleepFor10ms(benchmark::State& state) { sleep_floor(state, kMaxWait); }

// A call queued on a full upstream, refused at the queue's timeout (20 ms).
void BM_Queue_Timeout20ms(benchmark::State& state) {
  Loaded load;
  std::vector<double> over;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto r = admit(load.engine(), "full");
    const auto took = Clock::now() - t0;
    if (!r.ok() || r.value().admitted) return state.SkipWithError("not refused at the timeout");
    over.push_back(us_over(took, kTimeout));
  }
  report(state, std::move(over));
}

// The same, bounded by the call's max_wait (10 ms, below the queue's timeout).
void BM_Queue_MaxWait10ms(benchmark::State& state) {
  Loaded load;
  std::vector<double> over;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto r = admit(load.engine(), "full", Nanos{kMaxWait});
    const auto took = Clock::now() - t0;
    if (!r.ok() || r.value().admitted) return state.SkipWithError("not refused at max_wait");
    over.push_back(us_over(took, kMaxWait));
  }
  report(state, std::move(over));
}

// From the release of a slot to its waiter's answer (a handoff), under the same load.
void BM_Queue_Handoff(benchmark::State& state) {
  Loaded load;
  Engine& e = load.engine();
  std::string held = admit(e, "handoff").value().lease_id;
  std::vector<double> over;
  for (auto _ : state) {
    state.PauseTiming();
    Answer waiter;
    const CallAttribute at[] = {{"tenant", "t"}, {"upstream", "handoff"}};
    const AdmitCall c{.policy = "gw", .attributes = at};
    if (auto r = e.admit(c, waiter)) return state.SkipWithError("not queued");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    state.ResumeTiming();
    const auto t0 = Clock::now();
    (void)e.release(held, CallResult::kSuccess, std::nullopt);
    auto r = waiter.wait();
    const auto took = waiter.at() - t0;
    if (!r.ok() || !r.value().admitted) return state.SkipWithError("not handed the slot");
    held = r.value().lease_id;
    over.push_back(us_over(took, Clock::duration{0}));
  }
  (void)e.release(held, CallResult::kSuccess, std::nullopt);
  report(state, std::move(over));
}

// The floor of a handoff: the same release with no call waiting (the slot just goes back).
void BM_Floor_ReleaseNoWaiter(benchmark::State& state) {
  Loaded load;
  Engine& e = load.engine();
  std::vector<double> over;
  for (auto _ : state) {
    state.PauseTiming();
    auto held = admit(e, "handoff");
    if (!held.ok() || !held.value().admitted) return state.SkipWithError("not admitted");
    state.ResumeTiming();
    const auto t0 = Clock::now();
    (void)e.release(held.value().lease_id, CallResult::kSuccess, std::nullopt);
    over.push_back(us_over(Clock::now() - t0, Clock::duration{0}));
  }
  report(state, std::move(over));
}

}  // namespace

BENCHMARK(BM_Floor_SleepFor20ms)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Queue_Timeout20ms)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Floor_SleepFor10ms)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Queue_MaxWait10ms)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Floor_ReleaseNoWaiter)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Queue_Handoff)->UseRealTime()->Unit(benchmark::kMicrosecond);

SLUICE_BENCH_RATIO("BM_Queue_Timeout20ms/real_time", "BM_Floor_SleepFor20ms/real_time", 0);
SLUICE_BENCH_RATIO("BM_Queue_MaxWait10ms/real_time", "BM_Floor_SleepFor10ms/real_time", 0);
SLUICE_BENCH_RATIO("BM_Queue_Handoff/real_time", "BM_Floor_ReleaseNoWaiter/real_time", 0);

SLUICE_BENCH_MAIN();
