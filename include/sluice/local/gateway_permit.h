// gateway_permit.h: a resolved call path (Target) and the RAII token of an admitted call.
//
// What it is: a Target names one (tenant, upstream, route) path through a Gateway as a few
// pointers into state the Gateway built up front; it is what the hot path acquires on. A
// GatewayPermit holds one unit at every level of its Target's path (tenant, upstream pool,
// binding, per-tenant, route, as configured) and gives all of them back when released or
// destroyed. A streaming call simply holds its permit until the stream ends.
//
// Invariants: every unit a permit took is given back exactly once: release() is idempotent,
// the destructor releases, a moved-from permit owns nothing. Releasing the upstream unit may
// hand it directly to the head of that upstream's queue (see gateway.h); the handoff and its
// callback run on the releasing thread.
//
// Thread-safety: a Target is an immutable value, safe to share. A permit is owned by one thread
// at a time; permits of the same Gateway may be released concurrently from any threads. The
// Gateway must outlive its Targets and permits.
#pragma once

#include <utility>

namespace sluice {

namespace gateway_detail {
struct Access;
struct Level;
struct Pool;
struct RouteState;
struct Chain;
}  // namespace gateway_detail

class Target;
namespace gateway_detail {
// Gives back every unit of a permit on `target`: route first, upstream pool last.
void release_chain(const Target& target) noexcept;
}  // namespace gateway_detail

class Target {
 public:
  Target() noexcept = default;
  // False for a default-constructed Target, which no Gateway call accepts.
  [[nodiscard]] bool valid() const noexcept { return access_ != nullptr; }
  friend bool operator==(const Target&, const Target&) = default;

 private:
  friend class Gateway;
  friend class GatewayPermit;
  friend struct gateway_detail::Chain;
  friend void gateway_detail::release_chain(const Target&) noexcept;
  Target(gateway_detail::Access* access, gateway_detail::RouteState* route,
         gateway_detail::Level* tenant, gateway_detail::Pool* pool, gateway_detail::Level* binding,
         gateway_detail::Level* per_tenant) noexcept
      : access_(access),
        route_(route),
        tenant_(tenant),
        pool_(pool),
        binding_(binding),
        per_tenant_(per_tenant) {}

  gateway_detail::Access* access_ = nullptr;
  gateway_detail::RouteState* route_ = nullptr;  // null: the call names no route
  // The levels a call takes, in order (null: none), copied from *access_ so that an admission
  // that succeeds never reads the Access record: on a cold tenant that is one cache miss fewer,
  // and the levels' own lines are fetched at once rather than after access_'s line.
  gateway_detail::Level* tenant_ = nullptr;
  gateway_detail::Pool* pool_ = nullptr;
  gateway_detail::Level* binding_ = nullptr;
  gateway_detail::Level* per_tenant_ = nullptr;
};

class [[nodiscard]] GatewayPermit {
 public:
  GatewayPermit() noexcept = default;
  GatewayPermit(GatewayPermit&& other) noexcept : target_(std::exchange(other.target_, {})) {}
  GatewayPermit& operator=(GatewayPermit&& other) noexcept {
    if (this != &other) {
      release();
      target_ = std::exchange(other.target_, {});
    }
    return *this;
  }
  GatewayPermit(const GatewayPermit&) = delete;
  GatewayPermit& operator=(const GatewayPermit&) = delete;
  ~GatewayPermit() { release(); }

  // Gives every unit back; later calls do nothing.
  void release() noexcept {
    const Target t = std::exchange(target_, {});
    if (t.access_ != nullptr) gateway_detail::release_chain(t);
  }
  [[nodiscard]] bool held() const noexcept { return target_.valid(); }
  explicit operator bool() const noexcept { return held(); }
  // The path this permit holds (invalid once released).
  [[nodiscard]] const Target& target() const noexcept { return target_; }

 private:
  friend struct gateway_detail::Chain;
  explicit GatewayPermit(Target target) noexcept : target_(target) {}
  Target target_;
};

}  // namespace sluice
