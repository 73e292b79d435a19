// The concurrency kind's queue through the Engine, as both transports drive it (their Deferral
// is replaced by the test's): every queued admit is answered exactly once however its wait
// ends (a slot handed over, the queue's timeout, the call's max_wait, the caller gone, the
// policy removed, the server draining), never more calls in flight than the limit, and nothing
// left held or waiting after. The sanitizer builds run it too (the transports' own tests are
// tests/transport and clients/python/tests/test_queue.py).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;

std::string config(int limit, const char* timeout, int depth = 50) {
  return "policies:\n"
         "  gw:\n"
         "    kind: concurrency\n"
         "    tenants:\n"
         "      - id: t\n"
         "    upstreams:\n"
         "      - id: q\n"
         "        host: q.internal\n"
         "        owner: t\n"
         "        concurrency_limit:\n"
         "          max_concurrent: " +
         std::to_string(limit) +
         "\n"
         "          strategy: queue\n"
         "          queue:\n"
         "            max_depth: " +
         std::to_string(depth) +
         "\n"
         "            timeout: " +
         timeout + "\n";
}

// One admit as a transport makes it: answered inline or through the Completion; its cancel hook
// kept so the test can play a caller that goes away.
class Call final : public Deferral<AdmitResult> {
 public:
  Completion<AdmitResult> defer() override {
    return [this](StatusOr<AdmitResult> r) { set(std::move(r)); };
  }
  void on_cancel(Once<void()> hook) override {
    const std::lock_guard lock(mu_);
    hook_ = std::move(hook);
  }
  void set(StatusOr<AdmitResult> r) {
    const std::lock_guard lock(mu_);
    ++answers_;
    result_.emplace(std::move(r));
  }
  // Fires the cancel hook (once), if it was given.
  void cancel() {
    Once<void()> hook;
    {
      const std::lock_guard lock(mu_);
      hook = std::move(hook_);
    }
    if (hook) hook();
  }
  // Waits up to `timeout` for the answer.
  std::optional<StatusOr<AdmitResult>> wait(Nanos timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      {
        const std::lock_guard lock(mu_);
        if (result_) return result_;
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
    return std::nullopt;
  }
  int answers() {
    const std::lock_guard lock(mu_);
    return answers_;
  }

 private:
  std::mutex mu_;
  std::optional<StatusOr<AdmitResult>> result_;
  Once<void()> hook_;
  int answers_ = 0;
};

AdmitCall gw_call(std::optional<Nanos> max_wait = std::nullopt) {
  static const CallAttribute kTenantAndUpstream[] = {{"tenant", "t"}, {"upstream", "q"}};
  return AdmitCall{.policy = "gw", .max_wait = max_wait, .attributes = kTenantAndUpstream};
}

nlohmann::json queue_state(const Engine& e) {
  const nlohmann::json all = nlohmann::json::parse(e.policies_json());
  for (const auto& p : all["policies"])
    if (p["name"] == "gw") return p["queues"].value("q", nlohmann::json::object());
  return nlohmann::json::object();
}

std::uint64_t in_flight(const Engine& e) {
  for (const PolicyInfo& p : e.policies())
    if (p.name == "gw") return p.in_flight;
  return 0;
}

// Admits `call` through `d`: the inline answer is given to `d` too.
void admit(Engine& e, Call& d, const AdmitCall& call) {
  if (auto r = e.admit(call, d)) d.set(std::move(*r));
}

TEST(QueuePolicy, ManyCallersCancellingAndTimingOutNeverExceedTheLimitOrLoseAnAnswer) {
  constexpr int kLimit = 2;
  auto created = Engine::create(config_of(config(kLimit, "30ms")), SteadyClock::instance());
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  Engine& e = *created.value();
  std::atomic<int> running{0}, max_running{0}, admitted{0}, refused{0}, cancelled{0};
  std::atomic<int> lost{0}, twice{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919U);
      for (int i = 0; i < 60; ++i) {
        Call d;
        const int pick = static_cast<int>(rng() % 10);
        admit(e, d, gw_call(pick == 0 ? std::optional<Nanos>(milliseconds(5)) : std::nullopt));
        if (pick == 1) {
          std::this_thread::sleep_for(milliseconds(static_cast<int>(rng() % 3)));
          d.cancel();
        }
        auto r = d.wait(std::chrono::seconds(5));
        if (!r) {
          ++lost;
          continue;
        }
        if (!r->ok()) {
          ++cancelled;  // the caller went away
        } else if (r->value().admitted) {
          ++admitted;
          const int now = ++running;
          int seen = max_running.load();
          while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(std::chrono::microseconds(200 + rng() % 800));
          --running;
          ASSERT_TRUE(e.release(r->value().lease_id, CallResult::kSuccess, std::nullopt).ok());
        } else {
          ++refused;
        }
        std::this_thread::sleep_for(milliseconds(1));
        if (d.answers() != 1) ++twice;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(twice.load(), 0);
  EXPECT_LE(max_running.load(), kLimit);
  EXPECT_EQ(admitted + refused + cancelled, 8 * 60);
  EXPECT_GT(admitted.load(), 0);
  const nlohmann::json q = queue_state(e);
  EXPECT_EQ(q.value("waiting", -1), 0) << q.dump();
  EXPECT_GT(q.value("handoff", 0), 0) << q.dump();
  EXPECT_EQ(in_flight(e), 0u);
  EXPECT_EQ(e.leases(), 0u);
}

TEST(QueuePolicy, ACallerThatGoesAwayLeavesTheQueueAndTheNextOneGetsTheSlot) {
  auto created = Engine::create(config_of(config(1, "10s")), SteadyClock::instance());
  ASSERT_TRUE(created.ok());
  Engine& e = *created.value();
  auto first = e.admit(gw_call());
  ASSERT_TRUE(first.ok() && first.value().admitted);
  Call gone, next;
  admit(e, gone, gw_call());
  admit(e, next, gw_call());
  EXPECT_EQ(queue_state(e).value("waiting", -1), 2);
  gone.cancel();
  auto r = gone.wait(std::chrono::seconds(1));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status().code(), StatusCode::kAborted);
  EXPECT_EQ(queue_state(e).value("waiting", -1), 1);
  ASSERT_TRUE(e.release(first.value().lease_id, CallResult::kSuccess, std::nullopt).ok());
  r = next.wait(std::chrono::seconds(1));
  ASSERT_TRUE(r.has_value() && r->ok());
  EXPECT_TRUE(r->value().admitted);
  EXPECT_GT(r->value().waited, Nanos{0});
  ASSERT_TRUE(e.release(r->value().lease_id, CallResult::kSuccess, std::nullopt).ok());
  EXPECT_EQ(gone.answers(), 1);  // answered once, by the cancel; the slot went to `next`
  EXPECT_EQ(queue_state(e).value("cancelled", 0), 1);
  EXPECT_EQ(in_flight(e), 0u);
}

TEST(QueuePolicy, DrainAndRemovalAnswerEveryWaiterAtOnce) {
  auto created = Engine::create(config_of(config(1, "10s")), SteadyClock::instance());
  ASSERT_TRUE(created.ok());
  Engine& e = *created.value();
  auto first = e.admit(gw_call());
  ASSERT_TRUE(first.ok() && first.value().admitted);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(std::make_unique<Call>());
    admit(e, *calls.back(), gw_call());
  }
  // A reload that removes the policy answers its waiters.
  auto reloaded = e.reload(config_of("policies:\n  other:\n    kind: adaptive\n"));
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  for (auto& c : calls) {
    auto r = c->wait(milliseconds(500));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status().code(), StatusCode::kUnavailable);
    EXPECT_NE(r->status().message().find("removed or replaced by a reload"), std::string::npos);
  }
  ASSERT_TRUE(e.release(first.value().lease_id, CallResult::kSuccess, std::nullopt).ok());
  // Draining (SIGTERM) answers the waiters of the policies serving.
  ASSERT_TRUE(e.reload(config_of(config(1, "10s"))).ok());
  auto held = e.admit(gw_call());
  ASSERT_TRUE(held.ok() && held.value().admitted);
  Call waiting;
  admit(e, waiting, gw_call());
  e.drain();
  auto r = waiting.wait(milliseconds(500));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r->status().message().find("server: stopping"), std::string::npos);
  ASSERT_TRUE(e.release(held.value().lease_id, CallResult::kSuccess, std::nullopt).ok());
  e.close();
}

}  // namespace
}  // namespace sluice::server
