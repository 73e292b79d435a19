// algorithm_spec.h: which limit algorithm to run, with which limits, and the factory that
// builds it.
//
// What it is: a value naming one of the limit algorithms (fixed, AIMD, Vegas, Gradient2) and the
// limits a user set; unset limits take the algorithm's own defaults (each algorithm's header).
// validate() checks the limits against those defaults; make_algorithm() builds a fresh
// algorithm. Config files, the server and the simulator all build algorithms through it.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "sluice/core/limit_algorithm.h"

namespace sluice {

struct AlgorithmSpec {
  enum class Kind : std::uint8_t { kFixed, kAimd, kVegas, kGradient2 };
  Kind kind = Kind::kGradient2;
  std::optional<std::uint32_t> limit;  // fixed only: its limit (default 20)
  // The adaptive algorithms only (a fixed limit never moves: validate() refuses them there).
  std::optional<std::uint32_t> initial_limit, min_limit, max_limit;

  // Empty when the limits make valid options for the algorithm (its defaults filling in what is
  // not set; min_limit <= initial_limit <= max_limit); else what is wrong, "<algorithm>:
  // <field> <what>".
  [[nodiscard]] std::string_view validate() const;

  friend bool operator==(const AlgorithmSpec&, const AlgorithmSpec&) = default;
};

// A fresh algorithm as the spec says (the algorithms' own defaults for unset fields).
[[nodiscard]] std::unique_ptr<LimitAlgorithm> make_algorithm(const AlgorithmSpec& spec);
// The same, its limit starting at `start_limit` clamped to the spec's [min_limit, max_limit]
// instead of at initial_limit (a limit learned under other bounds, carried over). A fixed
// algorithm ignores it: its limit is the spec's.
[[nodiscard]] std::unique_ptr<LimitAlgorithm> make_algorithm(const AlgorithmSpec& spec,
                                                             std::uint32_t start_limit);
// "fixed", "aimd", "vegas" or "gradient2" (the algorithms' own names).
[[nodiscard]] std::string_view algorithm_name(AlgorithmSpec::Kind kind) noexcept;

}  // namespace sluice
