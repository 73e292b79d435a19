// The outcome vocabulary on the wire (transport/wire.h): one CallResult per word and per API enum
// value, both ways, and what a limit and a cascade each read of it (server/permit.h).
#include <gtest/gtest.h>

#include <string>

#include "server/permit.h"
#include "transport/wire.h"

namespace sluice::transport {
namespace {

using server::CallResult;

constexpr CallResult kAll[] = {CallResult::kSuccess,  CallResult::kDropped, CallResult::kTimeout,
                               CallResult::kOverload, CallResult::kIgnored, CallResult::kFailed};

TEST(OutcomeWire, EveryOutcomeRoundTripsThroughItsWordAndItsEnumValue) {
  for (CallResult r : kAll) {
    const std::string word(server::to_string(r));
    const auto by_word = call_result_of(word);
    ASSERT_TRUE(by_word.ok()) << word;
    EXPECT_EQ(by_word.value(), r) << word;
    const auto by_enum = call_result_of(to_proto(r));
    ASSERT_TRUE(by_enum.ok()) << word;
    EXPECT_EQ(by_enum.value(), r) << word;
  }
  EXPECT_EQ(call_result_of(v1::OUTCOME_UNSPECIFIED).value(), CallResult::kSuccess);
}

TEST(OutcomeWire, AnUnknownWordOrValueIsRefusedByName) {
  EXPECT_EQ(call_result_of("slow").status().message(),
            "outcome: must be success, dropped, timeout, overload, ignored or failed, not 'slow'");
  EXPECT_EQ(call_result_of("", "--outcome").status().message(),
            "--outcome: must be success, dropped, timeout, overload, ignored or failed, not ''");
  EXPECT_EQ(call_result_of(static_cast<v1::Outcome>(99)).status().message(),
            "outcome: unknown value 99");
}

TEST(OutcomeWire, ALimitSeesTimeoutAndOverloadAsADrop) {
  EXPECT_EQ(server::to_outcome(CallResult::kTimeout), Outcome::kDropped);
  EXPECT_EQ(server::to_outcome(CallResult::kOverload), Outcome::kDropped);
  EXPECT_EQ(server::to_outcome(CallResult::kDropped), Outcome::kDropped);
  EXPECT_EQ(server::to_outcome(CallResult::kFailed), Outcome::kIgnored);
  EXPECT_EQ(server::to_outcome(CallResult::kSuccess), Outcome::kSuccess);
}

}  // namespace
}  // namespace sluice::transport
