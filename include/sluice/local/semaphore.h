// semaphore.h: a lock-free counting semaphore that never blocks, and its RAII Permit.
//
// What it is: an in-flight counter with a run-time-changeable limit. try_acquire() admits one
// call when in_flight < limit and returns a move-only Permit that gives the unit back when it is
// released or destroyed.
//
// Invariants:
//   - Admitted units <= limit at every admission, under any interleaving of acquires and limit
//     changes: the limit and the count live in ONE 64-bit atomic word (limit in the high 32 bits,
//     count in the low 32) and admission is ONE fetch_add on that word that admits exactly when
//     the word it replaced had count < limit; a refused acquire rolls its increment back. So
//     the decision is made on a consistent (count, limit) pair, and two acquirers can never both
//     take the last unit.
//   - The raw count may read above the admitted count for the instant between a refused
//     acquirer's increment and its rollback (at most one unit per concurrently refused caller).
//     That is never an admission: it can only make a concurrent acquire refuse spuriously, the
//     safe direction. (A compare-exchange loop would avoid it but costs an extra dependent load,
//     ~40% more per admission here; see bench/semaphore.cpp.)
//   - Lowering the limit never revokes a held permit: in_flight may then sit above the limit and
//     drains as permits are released; no new permit is admitted until in_flight < limit.
//   - Every admitted unit is given back exactly once (Permit::release() is idempotent; the
//     destructor releases; a moved-from Permit owns nothing).
//
// Thread-safety: every member is safe to call concurrently. Memory order: a successful acquire
// is an acquire operation and a release is a release operation on the word, so work done under
// one permit happens-before a later holder of the unit it gave back. Nothing here blocks,
// allocates or takes a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <utility>

namespace sluice {

class Permit;

class Semaphore {
 public:
  // The largest limit a Semaphore holds; also what "unlimited" means to callers that need one.
  // Half the count's range, so transient increments of refused acquirers can never carry into
  // the limit half of the word.
  static constexpr std::uint32_t kMaxLimit = 0x7FFF'FFFFu;

  // `limit` above kMaxLimit is treated as kMaxLimit.
  explicit Semaphore(std::uint32_t limit) noexcept : word_(pack(clamp(limit), 0)) {}
  Semaphore(const Semaphore&) = delete;
  Semaphore& operator=(const Semaphore&) = delete;

  // Admits one call if in_flight < limit. Never blocks.
  [[nodiscard]] std::optional<Permit> try_acquire() noexcept;

  // Low-level form for composites that own the release themselves (guards, gateway chains):
  // true if one unit was taken. Each true must be matched by exactly one release_unit().
  // `order` (acquire by default) lets a composite put the admission into the seq_cst total
  // order when it pairs the semaphore with another atomic (the gateway's queue handoff).
  [[nodiscard]] bool try_acquire_unit(
      std::memory_order order = std::memory_order_acquire) noexcept {
    const std::uint64_t before = word_.fetch_add(1, order);
    if (in_flight_of(before) < limit_of(before)) [[likely]]
      return true;
    word_.fetch_sub(1, std::memory_order_relaxed);  // refused: nothing was admitted
    return false;
  }
  // As try_acquire_unit(), but a refusal leaves its increment in place: on false the caller
  // must give it back with release_unit() itself. For composites that must act after every
  // decrement of the count (the gateway's queue reads its waiters then, so that a refused
  // acquirer's transient increment cannot hide a free unit from a waiter).
  [[nodiscard]] bool try_claim_unit(std::memory_order order) noexcept {
    const std::uint64_t before = word_.fetch_add(1, order);
    return in_flight_of(before) < limit_of(before);
  }
  // Gives one unit back. Precondition: a unit taken by try_acquire_unit() is outstanding.
  void release_unit(std::memory_order order = std::memory_order_release) noexcept {
    word_.fetch_sub(1, order);
  }

  // Changes the limit at run time (clamped to kMaxLimit). Held permits are never revoked.
  void set_limit(std::uint32_t limit) noexcept;

  // Units held (plus, for an instant, refused acquirers mid-rollback: see invariants).
  [[nodiscard]] std::uint32_t in_flight() const noexcept {
    return in_flight_of(word_.load(std::memory_order_relaxed));
  }
  [[nodiscard]] std::uint32_t limit() const noexcept {
    return limit_of(word_.load(std::memory_order_relaxed));
  }
  // in_flight and limit read together (one load: a consistent pair).
  struct Snapshot {
    std::uint32_t in_flight;
    std::uint32_t limit;
  };
  [[nodiscard]] Snapshot snapshot() const noexcept {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    return {in_flight_of(w), limit_of(w)};
  }

 private:
  static constexpr std::uint32_t clamp(std::uint32_t limit) noexcept {
    return limit < kMaxLimit ? limit : kMaxLimit;
  }
  static constexpr std::uint64_t pack(std::uint32_t limit, std::uint32_t in_flight) noexcept {
    return (std::uint64_t{limit} << 32) | in_flight;
  }
  static constexpr std::uint32_t limit_of(std::uint64_t w) noexcept {
    return static_cast<std::uint32_t>(w >> 32);
  }
  static constexpr std::uint32_t in_flight_of(std::uint64_t w) noexcept {
    return static_cast<std::uint32_t>(w);
  }

  static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
  // One cache line of its own: neighbouring semaphores must not false-share.
  alignas(64) std::atomic<std::uint64_t> word_;
};

// A move-only token for one admitted unit of a Semaphore. Released on destruction; release()
// is idempotent. The Semaphore must outlive the Permit.
class [[nodiscard]] Permit {
 public:
  Permit() noexcept = default;
  Permit(Permit&& other) noexcept : sem_(std::exchange(other.sem_, nullptr)) {}
  Permit& operator=(Permit&& other) noexcept {
    if (this != &other) {
      release();
      sem_ = std::exchange(other.sem_, nullptr);
    }
    return *this;
  }
  Permit(const Permit&) = delete;
  Permit& operator=(const Permit&) = delete;
  ~Permit() { release(); }

  // Gives the unit back; later calls do nothing.
  void release() noexcept {
    if (Semaphore* s = std::exchange(sem_, nullptr)) s->release_unit();
  }
  // True while this permit still holds its unit.
  [[nodiscard]] bool held() const noexcept { return sem_ != nullptr; }
  explicit operator bool() const noexcept { return held(); }

 private:
  friend class Semaphore;
  explicit Permit(Semaphore* sem) noexcept : sem_(sem) {}
  Semaphore* sem_ = nullptr;
};

inline std::optional<Permit> Semaphore::try_acquire() noexcept {
  if (!try_acquire_unit()) return std::nullopt;
  return Permit(this);
}

}  // namespace sluice
