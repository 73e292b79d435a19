#include "sluice/core/algorithm_spec.h"

#include <algorithm>

#include "sluice/core/aimd_limit.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/core/gradient2_limit.h"
#include "sluice/core/vegas_limit.h"

namespace sluice {
namespace {

// The algorithm's options with the spec's limits over the algorithm's own defaults.
template <class Options>
Options with_limits(const AlgorithmSpec& s) {
  Options o;
  o.initial_limit = s.initial_limit.value_or(o.initial_limit);
  o.min_limit = s.min_limit.value_or(o.min_limit);
  o.max_limit = s.max_limit.value_or(o.max_limit);
  return o;
}

template <class Options>
Options starting_at(const AlgorithmSpec& s, std::uint32_t start) {
  Options o = with_limits<Options>(s);
  o.initial_limit = std::clamp(start, o.min_limit, std::max(o.min_limit, o.max_limit));
  return o;
}

}  // namespace

std::string_view AlgorithmSpec::validate() const {
  switch (kind) {
    case Kind::kFixed:
      if (initial_limit) return "fixed: initial_limit applies to the adaptive algorithms only";
      if (min_limit) return "fixed: min_limit applies to the adaptive algorithms only";
      if (max_limit) return "fixed: max_limit applies to the adaptive algorithms only";
      return {};
    case Kind::kAimd:
      return with_limits<AimdOptions>(*this).validate();
    case Kind::kVegas:
      return with_limits<VegasOptions>(*this).validate();
    case Kind::kGradient2:
      return with_limits<Gradient2Options>(*this).validate();
  }
  return {};
}

std::unique_ptr<LimitAlgorithm> make_algorithm(const AlgorithmSpec& s) {
  switch (s.kind) {
    case AlgorithmSpec::Kind::kFixed:
      return std::make_unique<FixedLimit>(FixedLimitOptions{.limit = s.limit.value_or(20)});
    case AlgorithmSpec::Kind::kAimd:
      return std::make_unique<AimdLimit>(with_limits<AimdOptions>(s));
    case AlgorithmSpec::Kind::kVegas:
      return std::make_unique<VegasLimit>(with_limits<VegasOptions>(s));
    case AlgorithmSpec::Kind::kGradient2:
      return std::make_unique<Gradient2Limit>(with_limits<Gradient2Options>(s));
  }
  return nullptr;
}

std::unique_ptr<LimitAlgorithm> make_algorithm(const AlgorithmSpec& s, std::uint32_t start_limit) {
  switch (s.kind) {
    case AlgorithmSpec::Kind::kFixed:
      return make_algorithm(s);
    case AlgorithmSpec::Kind::kAimd:
      return std::make_unique<AimdLimit>(starting_at<AimdOptions>(s, start_limit));
    case AlgorithmSpec::Kind::kVegas:
      return std::make_unique<VegasLimit>(starting_at<VegasOptions>(s, start_limit));
    case AlgorithmSpec::Kind::kGradient2:
      return std::make_unique<Gradient2Limit>(starting_at<Gradient2Options>(s, start_limit));
  }
  return nullptr;
}

std::string_view algorithm_name(AlgorithmSpec::Kind kind) noexcept {
  switch (kind) {
    case AlgorithmSpec::Kind::kFixed:
      return "fixed";
    case AlgorithmSpec::Kind::kAimd:
      return "aimd";
    case AlgorithmSpec::Kind::kVegas:
      return "vegas";
    case AlgorithmSpec::Kind::kGradient2:
      return "gradient2";
  }
  return "unknown";
}

}  // namespace sluice
