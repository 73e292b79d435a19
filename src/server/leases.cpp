#include "server/leases.h"

#include <sys/random.h>

#include <cerrno>
#include <functional>
#include <stdexcept>

namespace sluice::server {

std::string_view to_string(CallResult r) noexcept {
  switch (r) {
    case CallResult::kSuccess:
      return "success";
    case CallResult::kDropped:
      return "dropped";
    case CallResult::kIgnored:
      return "ignored";
    case CallResult::kFailed:
      return "failed";
    case CallResult::kTimeout:
      return "timeout";
    case CallResult::kOverload:
      return "overload";
  }
  return "unknown";
}

std::string new_lease_id() {
  unsigned char bytes[16];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("getrandom failed");
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (std::size_t i = 0; i < sizeof bytes; ++i) {
    id[2 * i] = kHex[bytes[i] >> 4];
    id[2 * i + 1] = kHex[bytes[i] & 0xf];
  }
  return id;
}

bool well_formed_lease_id(std::string_view id) noexcept {
  if (id.size() != 32) return false;
  for (const char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

LeaseTable::Shard& LeaseTable::shard_of(std::string_view id) noexcept {
  return shards_[std::hash<std::string_view>{}(id) % kShards];
}

std::string LeaseTable::insert(Lease lease) {
  while (true) {
    std::string id = new_lease_id();
    Shard& s = shard_of(id);
    const std::lock_guard lock(s.mu);
    if (s.leases.contains(id)) continue;  // 2^-128: but never overwrite a live lease
    s.due.push(Due{lease.expires_at, id});
    s.leases.emplace(id, std::move(lease));
    return id;
  }
}

std::optional<Lease> LeaseTable::take(std::string_view id, Nanos now) {
  std::optional<Lease> out;
  {
    Shard& s = shard_of(id);
    const std::lock_guard lock(s.mu);
    auto it = s.leases.find(id);
    if (it == s.leases.end()) return std::nullopt;
    out.emplace(std::move(it->second));
    s.leases.erase(it);
  }
  if (out->expires_at > now) return out;
  out->permit.finish(CallEnd{CallResult::kIgnored, Nanos{0}, CallEnd::By::kExpiry});
  expired_.fetch_add(1, std::memory_order_relaxed);
  return std::nullopt;
}

std::optional<Renewal> LeaseTable::renew(std::string_view id, std::span<const CallEnd> earlier,
                                         bool keep, CallResult result, std::optional<Nanos> rtt,
                                         Nanos now) {
  std::optional<Lease> expired;
  {
    Shard& s = shard_of(id);
    const std::lock_guard lock(s.mu);
    auto it = s.leases.find(id);
    if (it == s.leases.end()) return std::nullopt;
    Lease& l = it->second;
    if (l.expires_at > now) {
      if (!l.reusable) return Renewal{};
      // Under the shard's lock: a renewal never blocks (GuardPermit::renew).
      Renewal out{true, now - l.admitted_at, true};
      for (const CallEnd& e : earlier) out.kept = l.permit.renew(e);
      if (keep) {
        out.kept = l.permit.renew(CallEnd{result, rtt.value_or(out.held), CallEnd::By::kClient});
        l.admitted_at = now;
        move_deadline(s, it->first, l, now + l.ttl);
      }
      return out;
    }
    expired.emplace(std::move(l));
    s.leases.erase(it);
  }
  expired->permit.finish(CallEnd{CallResult::kIgnored, Nanos{0}, CallEnd::By::kExpiry});
  expired_.fetch_add(1, std::memory_order_relaxed);
  return std::nullopt;
}

void LeaseTable::move_deadline(Shard& s, const std::string& id, Lease& lease, Nanos to) {
  // Later: the entry in the heap surfaces first and is pushed again then (expire()).
  if (to < lease.expires_at) s.due.push(Due{to, id});
  lease.expires_at = to;
}

std::optional<Nanos> LeaseTable::extend(std::string_view id, std::optional<Nanos> ttl, Nanos now) {
  Shard& s = shard_of(id);
  const std::lock_guard lock(s.mu);
  auto it = s.leases.find(id);
  if (it == s.leases.end() || it->second.expires_at <= now) return std::nullopt;
  if (ttl) it->second.ttl = *ttl;
  move_deadline(s, it->first, it->second, now + it->second.ttl);
  return it->second.ttl;
}

std::size_t LeaseTable::expire(Nanos now) {
  std::size_t n = 0;
  std::vector<Lease> done;
  for (Shard& s : shards_) {
    {
      const std::lock_guard lock(s.mu);
      while (!s.due.empty() && s.due.top().at <= now) {
        const Due d = s.due.top();
        s.due.pop();
        auto it = s.leases.find(d.id);
        if (it == s.leases.end()) continue;  // released
        if (it->second.expires_at > now) {   // its deadline moved later since: push it again
          s.due.push(Due{it->second.expires_at, d.id});
          continue;
        }
        done.push_back(std::move(it->second));
        s.leases.erase(it);
      }
      // Deadlines moved earlier and releases leave stale entries; rebuild when they dominate.
      if (s.due.size() > 64 && s.due.size() > 4 * s.leases.size()) {
        decltype(s.due) fresh;
        for (const auto& [id, lease] : s.leases) fresh.push(Due{lease.expires_at, id});
        s.due.swap(fresh);
      }
    }
    for (Lease& l : done)
      l.permit.finish(CallEnd{CallResult::kIgnored, Nanos{0}, CallEnd::By::kExpiry});
    n += done.size();
    done.clear();
  }
  expired_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

std::size_t LeaseTable::clear() {
  std::size_t n = 0;
  for (Shard& s : shards_) {
    StringMap<Lease> taken;
    {
      const std::lock_guard lock(s.mu);
      taken.swap(s.leases);
      s.due = {};
    }
    for (auto& [id, l] : taken)
      l.permit.finish(CallEnd{CallResult::kIgnored, Nanos{0}, CallEnd::By::kShutdown});
    n += taken.size();
  }
  return n;
}

std::size_t LeaseTable::size() const {
  std::size_t n = 0;
  for (const Shard& s : shards_) {
    const std::lock_guard lock(s.mu);
    n += s.leases.size();
  }
  return n;
}

}  // namespace sluice::server
