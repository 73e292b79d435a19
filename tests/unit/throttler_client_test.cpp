// The throttler's client helpers (sluice/backends/throttler_client.h) on a manual clock: the
// backoff's 1-2-4-4 s sequence with its jitter and floor, the wait's deadline, the chunked job's
// counts, reading answers (the JSON, a bare status, a 5xx or a foreign page as unreachable) and the
// client's option checks.
#include "sluice/backends/throttler_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A clock that moves only when the code under test sleeps; records the sleeps.
struct ManualTime {
  Nanos now{0};
  std::vector<Nanos> sleeps;
  double draw = 0.5;  // the jitter's draw: 0.5 is no jitter
  WaitHooks hooks() {
    WaitHooks h;
    h.now = [this] { return now; };
    h.sleep = [this](Nanos d) {
      sleeps.push_back(d);
      now += d;
    };
    h.random = [this] { return draw; };
    return h;
  }
};

ThrottlerAnswer answer(bool ok, double value = 0) {
  ThrottlerAnswer a;
  a.ok = ok;
  a.status = ok ? 200 : 429;
  a.value = value;
  return a;
}

// Answers from a script, then `last` forever.
struct Script {
  std::deque<ThrottlerAnswer> answers;
  ThrottlerAnswer last = answer(true);
  int asked = 0;
  ThrottlerAnswer operator()() {
    ++asked;
    if (answers.empty()) return last;
    ThrottlerAnswer a = answers.front();
    answers.pop_front();
    return a;
  }
};

TEST(ThrottlerClient, BackoffDoublesFromOneSecondToItsCapWithJitterAndAFloor) {
  const ThrottleBackoff b;
  EXPECT_EQ(backoff_delay(b, 1, 0.5), seconds(1));
  EXPECT_EQ(backoff_delay(b, 2, 0.5), seconds(2));
  EXPECT_EQ(backoff_delay(b, 3, 0.5), seconds(4));
  EXPECT_EQ(backoff_delay(b, 4, 0.5), seconds(4));
  EXPECT_EQ(backoff_delay(b, 1000, 0.5), seconds(4));
  // Jitter: +-20% at the extremes of the draw.
  EXPECT_EQ(backoff_delay(b, 3, 0.0), milliseconds(3200));
  EXPECT_EQ(backoff_delay(b, 3, 1.0), milliseconds(4800));
  // Never below the sampling interval.
  ThrottleBackoff fast;
  fast.initial = milliseconds(10);
  fast.cap = milliseconds(40);
  fast.min_interval = milliseconds(100);
  EXPECT_EQ(backoff_delay(fast, 1, 0.5), milliseconds(100));
  EXPECT_EQ(backoff_error(b), "");
  ThrottleBackoff bad;
  bad.cap = milliseconds(1);
  EXPECT_EQ(backoff_error(bad), "cap: must be >= initial");
  bad = {};
  bad.jitter = 1;
  EXPECT_EQ(backoff_error(bad), "jitter: must be in [0, 1)");
}

TEST(ThrottlerClient, WaitingSleepsOneTwoFourFourUntilAllowed) {
  ManualTime t;
  Script s;
  for (int i = 0; i < 4; ++i) s.answers.push_back(answer(false));
  const WaitResult r = wait_until_allowed(std::ref(s), seconds(60), {}, t.hooks());
  EXPECT_TRUE(r.allowed);
  EXPECT_EQ(r.checks, 5u);
  EXPECT_EQ(r.refusals, 4u);
  EXPECT_EQ(t.sleeps, (std::vector<Nanos>{seconds(1), seconds(2), seconds(4), seconds(4)}));
  EXPECT_EQ(r.waited, seconds(11));
}

TEST(ThrottlerClient, WaitingNeverSleepsPastTheDeadlineAndReturnsTheLastRefusal) {
  ManualTime t;
  Script s;
  s.last = answer(false, 7.5);
  s.last.reason = "threshold_exceeded";
  std::vector<Nanos> told;
  WaitHooks h = t.hooks();
  h.on_wait = [&](const ThrottlerAnswer& a, Nanos d) {
    EXPECT_EQ(a.reason, "threshold_exceeded");
    told.push_back(d);
  };
  const WaitResult r = wait_until_allowed(std::ref(s), milliseconds(5500), {}, h);
  EXPECT_FALSE(r.allowed);
  EXPECT_EQ(r.last.value, 7.5);
  // 1 + 2 = 3 s, then 2.5 s left (not 4): one last check at the deadline.
  EXPECT_EQ(t.sleeps, (std::vector<Nanos>{seconds(1), seconds(2), milliseconds(2500)}));
  EXPECT_EQ(told, t.sleeps);
  EXPECT_EQ(t.now, milliseconds(5500));
  EXPECT_EQ(r.checks, 4u);
}

TEST(ThrottlerClient, AChunkedJobChecksBeforeEveryChunkAndTheBackoffStartsOver) {
  ManualTime t;
  Script s;
  // chunk 1 at once; chunk 2 after two refusals; chunk 3 after one.
  s.answers = {answer(true), answer(false, 3), answer(false, 2),
               answer(true), answer(false, 1), answer(true)};
  int ran = 0;
  const ChunkStats c = run_in_chunks(
      std::ref(s), [&] { return ++ran < 3; }, seconds(60), {}, t.hooks());
  EXPECT_TRUE(c.completed);
  EXPECT_EQ(ran, 3);
  EXPECT_EQ(c.chunks, 3u);
  EXPECT_EQ(c.checks, 6u);
  EXPECT_EQ(c.refusals, 3u);
  EXPECT_EQ(c.max_value, 3);
  // 1, 2 before chunk 2; 1 again (not 4) before chunk 3.
  EXPECT_EQ(t.sleeps, (std::vector<Nanos>{seconds(1), seconds(2), seconds(1)}));
  EXPECT_EQ(c.waited, seconds(4));

  // A wait that hits its deadline ends the job, not completed.
  ManualTime t2;
  Script never;
  never.last = answer(false);
  ran = 0;
  const ChunkStats stuck = run_in_chunks(
      std::ref(never), [&] { return ++ran < 100; }, seconds(3), {}, t2.hooks());
  EXPECT_FALSE(stuck.completed);
  EXPECT_EQ(ran, 0);
  EXPECT_EQ(stuck.chunks, 0u);
}

TEST(ThrottlerClient, AnswersReadTheBodyAndAnUnreachableThrottlerHoldsByDefault) {
  ThrottlerAnswer a = throttler_answer(
      429,
      R"({"StatusCode":429,"Value":2.5,"Threshold":1,"MetricName":"lag","Message":"lag over",)"
      R"("reason":"threshold_exceeded","value":2.5,"threshold":1})",
      OnUnreachable::kHold);
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.reason, "threshold_exceeded");
  EXPECT_EQ(a.value, 2.5);
  EXPECT_EQ(a.threshold, 1);
  EXPECT_EQ(a.metric, "lag");
  EXPECT_FALSE(a.unreachable);
  a = throttler_answer(200, R"({"StatusCode":200,"reason":"ok"})", OnUnreachable::kHold);
  EXPECT_TRUE(a.ok);
  // A bare status (HEAD, freno): the status is the answer.
  a = throttler_answer(417, "", OnUnreachable::kProceed);
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.reason, "app_throttled");
  // A 5xx, or a 200 that is someone else's page: unreachable, as the client chose.
  a = throttler_answer(503, "busy", OnUnreachable::kHold);
  EXPECT_TRUE(a.unreachable);
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.reason, "unreachable: the throttler answered 503");
  a = throttler_answer(200, "<html>proxy</html>", OnUnreachable::kHold);
  EXPECT_TRUE(a.unreachable);
  EXPECT_FALSE(a.ok);
  a = throttler_answer(502, "", OnUnreachable::kProceed);
  EXPECT_TRUE(a.ok);
}

ThrottlerClientOptions options(std::string url, std::string app, std::string scope = "") {
  ThrottlerClientOptions o;
  o.url = std::move(url);
  o.app = std::move(app);
  o.scope = std::move(scope);
  return o;
}

TEST(ThrottlerClient, OptionsAreCheckedAndNoServerIsUnreachable) {
  EXPECT_EQ(ThrottlerClient::create(options("https://x", "a")).status().message(),
            "url: must start with http:// (https is not supported)");
  EXPECT_EQ(ThrottlerClient::create(options("http://127.0.0.1:1", "")).status().message(),
            "app: must name the app that checks");
  EXPECT_EQ(ThrottlerClient::create(options("http://127.0.0.1:1", "a", "x")).status().message(),
            "scope: must be self or shard, not 'x'");
  // Port 1 on loopback: nothing listens; the answer says so and holds.
  auto c = ThrottlerClient::create(options("http://127.0.0.1:1", "a"));
  ASSERT_TRUE(c.ok());
  const ThrottlerAnswer a = c.value().check();
  EXPECT_TRUE(a.unreachable);
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.status, 0);
  EXPECT_NE(a.reason.find("cannot connect"), std::string::npos) << a.reason;
}

}  // namespace
}  // namespace sluice
