// gateway_merge.h: the effective concurrency limit of one tenant on one upstream.
//
// What it is: a pure function of the upstream's limit and, for a descendant, the limit in its
// binding. The merge table (ancestor's `sharing` x what the descendant specifies):
//
//   private  + (required)  -> the descendant's own limit, in a SEPARATE pool
//   inherit  + nothing     -> the ancestor's limit
//   inherit  + own         -> min(ancestor, own), field by field (the stricter wins)
//   enforce  + anything    -> min(ancestor, own), field by field (the stricter wins)
//   private  + no own max  -> no effective limit: the binding is invalid
//
// An unset `sharing` is kInherit; an upstream without a limit behaves as kInherit with every
// field unlimited (min with "unlimited" is the other side).
//
// Counting (sharing semantics): for inherit and enforce the descendant's calls count in the
// owner's upstream pool, so the upstream's max_concurrent bounds ALL traffic to it; a
// descendant whose effective max_concurrent is stricter than the pool's also gets a binding
// semaphore of its own on top. A private binding's calls count only in its own pool (the
// owner's max_concurrent does not see them). Route limits always count every caller.
//
// Strategy and queue: calls wait in the pool they count in, so a shared pool uses the
// upstream's strategy and queue options and a private pool uses the binding's.
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstdint>
#include <optional>

#include "sluice/local/gateway_config.h"

namespace sluice {

struct EffectiveLimit {
  // True: the calls count in a pool of the descendant's own (a private binding).
  bool private_pool = false;
  // Bound on this tenant's in-flight calls to the upstream through this pool. Unset: unlimited.
  std::optional<std::uint32_t> max_concurrent;
  std::optional<std::uint32_t> per_tenant_max;
  // Of the pool the calls wait in.
  Strategy strategy = Strategy::kReject;
  QueueOptions queue;
};

// The owner's own use of its upstream: the upstream's limit as it stands.
[[nodiscard]] EffectiveLimit owner_limit(const std::optional<ConcurrencyLimit>& upstream) noexcept;

// A descendant's use of an ancestor's upstream through a binding. Empty only for a private
// upstream whose binding has no own max_concurrent (the descendant must provide a limit).
[[nodiscard]] std::optional<EffectiveLimit> merge_binding(
    const std::optional<ConcurrencyLimit>& upstream,
    const std::optional<ConcurrencyLimit>& own) noexcept;

// The stricter of two optional limits (unset means unlimited).
[[nodiscard]] constexpr std::optional<std::uint32_t> stricter(
    std::optional<std::uint32_t> a, std::optional<std::uint32_t> b) noexcept {
  if (!a) return b;
  if (!b) return a;
  return *a < *b ? a : b;
}

}  // namespace sluice
