// cascade.h: a node's success rate and weight, and the weighted random order.
#include "sluice/core/cascade.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>
#include <utility>

namespace sluice {

std::string_view cascade_health_error(const CascadeHealthOptions& o) noexcept {
  if (!(o.decay >= 1) || !std::isfinite(o.decay)) return "decay: must be a number >= 1";
  if (!(o.exponent > 0) || !std::isfinite(o.exponent)) return "exponent: must be a number > 0";
  if (!(o.floor_numerator > 0) || !(o.floor_numerator <= 1)) return "floor: must be in (0, 1]";
  return {};
}

namespace {

// r^e, by multiplication for a whole exponent up to 8 (the default 3 among them): a pick
// computes one per node.
double power(double r, double e) {
  if (e >= 1 && e <= 8 && e == std::floor(e)) {
    double out = r;
    for (int i = 1; i < static_cast<int>(e); ++i) out *= r;
    return out;
  }
  return std::pow(r, e);
}

}  // namespace

CascadeHealth cascade_health(std::span<const CascadeBucket> historical, CascadeBucket sticky,
                             std::size_t nodes, const CascadeHealthOptions& o) {
  CascadeHealth h;
  double finished = 0, succeeded = 0, w = 1;
  // Oldest first, so each newer bucket multiplies the running weight by `decay`.
  for (auto it = historical.rbegin(); it != historical.rend(); ++it, w *= o.decay) {
    finished += w * it->finished;
    succeeded += w * std::min(it->succeeded, it->finished);
  }
  if (finished > 0) {
    h.basis = CascadeHealth::Basis::kRecent;
    h.success_rate = std::clamp(succeeded / finished, 0.0, 1.0);
    h.weight = power(h.success_rate, o.exponent);
    return h;
  }
  if (sticky.finished > 0) {
    h.basis = CascadeHealth::Basis::kSticky;
    h.success_rate =
        static_cast<double>(std::min(sticky.succeeded, sticky.finished)) / sticky.finished;
    const double floor = o.floor_numerator / static_cast<double>(std::max<std::size_t>(nodes, 1));
    h.weight = std::max(power(h.success_rate, o.exponent), floor);
    return h;
  }
  return h;  // a clean slate: rate 1, weight 1
}

namespace {

double usable(double w) { return std::isfinite(w) && w > 0 ? w : 0; }

// A draw in (0, 1): 0 would give every key of every weight the same value 0.
double open_draw(const UniformDraw& draw) {
  const double u = draw();
  return u > 0 && u < 1 ? u : 0.5;
}

// Fisher-Yates over `order[first, last)`.
void shuffle(std::vector<std::size_t>& order, std::size_t first, std::size_t last,
             const UniformDraw& draw) {
  for (std::size_t i = last; i > first + 1; --i) {
    const std::size_t n = i - first;
    auto j = first + static_cast<std::size_t>(draw() * static_cast<double>(n));
    j = std::min(j, i - 1);
    std::swap(order[i - 1], order[j]);
  }
}

}  // namespace

void weighted_order(std::span<const double> weights, const UniformDraw& draw,
                    std::vector<std::size_t>& order) {
  const std::size_t n = weights.size();
  order.resize(n);
  // Keys of the weighted nodes: log(u) / w, the logarithm of u^(1/w) (same order, no
  // underflow for small weights).
  std::vector<std::pair<double, std::size_t>> keyed;
  keyed.reserve(n);
  std::vector<std::size_t> zero;
  for (std::size_t i = 0; i < n; ++i) {
    const double w = usable(weights[i]);
    if (w > 0)
      keyed.emplace_back(std::log(open_draw(draw)) / w, i);
    else
      zero.push_back(i);
  }
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::size_t k = 0;
  for (const auto& [key, i] : keyed) order[k++] = i;
  for (const std::size_t i : zero) order[k++] = i;
  shuffle(order, keyed.size(), n, draw);
}

WeightedDraws::WeightedDraws(std::span<const double> weights, std::vector<std::uint8_t>& taken)
    : weights_(weights), taken_(taken) {
  taken_.assign(weights.size(), 0);
  for (const double w : weights) {
    if (usable(w) > 0) {
      total_ += usable(w);
      ++positive_;
    } else {
      ++zero_;
    }
  }
}

std::optional<std::size_t> WeightedDraws::next(const UniformDraw& draw) {
  const std::size_t n = weights_.size();
  if (positive_ > 0) {
    double pick = draw() * total_;
    std::size_t last = n;
    for (std::size_t i = 0; i < n; ++i) {
      const double w = usable(weights_[i]);
      if (taken_[i] || w <= 0) continue;
      last = i;
      pick -= w;
      if (pick < 0) break;
    }
    // `last`: the node the draw fell on, or the last one left should rounding leave `pick` at
    // or above 0.
    taken_[last] = 1;
    --positive_;
    // Recomputed when it is the last positive one, so rounding never accumulates to a draw
    // of nothing.
    total_ = positive_ == 0 ? 0 : total_ - usable(weights_[last]);
    if (positive_ > 0 && !(total_ > 0)) {
      total_ = 0;
      for (std::size_t i = 0; i < n; ++i)
        if (!taken_[i]) total_ += usable(weights_[i]);
    }
    return last;
  }
  if (zero_ == 0) return std::nullopt;
  auto k = static_cast<std::size_t>(draw() * static_cast<double>(zero_));
  k = std::min(k, zero_ - 1);
  for (std::size_t i = 0; i < n; ++i) {
    if (taken_[i]) continue;
    if (k-- == 0) {
      taken_[i] = 1;
      --zero_;
      return i;
    }
  }
  return std::nullopt;  // unreachable: zero_ counts the nodes left
}

void approximate_order(std::span<const double> rates, std::span<const double> weights,
                       const UniformDraw& draw, std::vector<std::size_t>& order) {
  const std::size_t n = weights.size();
  order.resize(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  shuffle(order, 0, n, draw);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return (a < rates.size() ? rates[a] : 0) > (b < rates.size() ? rates[b] : 0);
  });
  double total = 0;
  for (const double w : weights) total += usable(w);
  if (total <= 0) return;
  double pick = draw() * total;
  for (std::size_t k = 0; k < n; ++k) {
    pick -= usable(weights[order[k]]);
    if (pick < 0 || k + 1 == n) {
      // The last node of positive weight, should rounding leave `pick` at 0.
      std::size_t chosen = k;
      while (usable(weights[order[chosen]]) <= 0 && chosen > 0) --chosen;
      std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(chosen),
                  order.begin() + static_cast<std::ptrdiff_t>(chosen) + 1);
      return;
    }
  }
}

}  // namespace sluice
