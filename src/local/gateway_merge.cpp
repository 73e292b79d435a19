#include "local/gateway_merge.h"

namespace sluice {

EffectiveLimit owner_limit(const std::optional<ConcurrencyLimit>& upstream) noexcept {
  EffectiveLimit out;
  if (!upstream) return out;
  out.max_concurrent = upstream->max_concurrent;
  out.per_tenant_max = upstream->per_tenant_max;
  out.strategy = upstream->strategy;
  out.queue = upstream->queue;
  return out;
}

std::optional<EffectiveLimit> merge_binding(const std::optional<ConcurrencyLimit>& upstream,
                                            const std::optional<ConcurrencyLimit>& own) noexcept {
  const Sharing sharing =
      upstream ? upstream->sharing.value_or(Sharing::kInherit) : Sharing::kInherit;
  if (sharing == Sharing::kPrivate) {
    if (!own || !own->max_concurrent) return std::nullopt;
    EffectiveLimit out = owner_limit(own);
    out.private_pool = true;
    return out;
  }
  EffectiveLimit out = owner_limit(upstream);  // inherit/enforce: the shared pool's queue
  if (own) {
    out.max_concurrent = stricter(out.max_concurrent, own->max_concurrent);
    out.per_tenant_max = stricter(out.per_tenant_max, own->per_tenant_max);
  }
  return out;
}

}  // namespace sluice
