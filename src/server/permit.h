// permit.h: one admitted call's permit as a lease holds it, whatever engine made it.
//
// What it is: LeasePermit is a move-only, type-erased holder of a policy kind's own permit (a
// GuardPermit, a GatewayPermit, ...) together with whatever that kind counts per lease. It is
// finished exactly once, with how the call ended (CallEnd): by its client (Release), by its
// lease's expiry, or at shutdown; a permit dropped unfinished is finished as ignored at
// shutdown. The lease table and the engine know nothing else about it, so a new kind needs no
// edit to either.
//
// CallResult is the one outcome vocabulary every transport carries and every kind reads for
// itself, richer than the guards' Outcome: kTimeout and kOverload say how a call was dropped (a
// cascade tells its nodes which; an adaptive limit, to_outcome() below, sees a drop either way),
// and kFailed is a call that failed for a reason that says nothing about overload (a 500, a bad
// request): no latency evidence (an adaptive limit treats it as ignored) but a health signal for
// kinds that track one.
//
// A kind's permit lives inline (no allocation): it must fit kInlineBytes, be nothrow movable
// and have `void finish(const CallEnd&) noexcept`. A larger one boxes itself. A kind whose
// permit can carry its client's next call (a Release with keep) also has
// `bool renew(const CallEnd&) noexcept`: the call is recorded as finish() would, the permit is
// kept, and the answer says whether the next call is within the policy's limit.
//
// Thread-safety: a LeasePermit is owned by one thread at a time (the lease table moves it out
// under its lock and finishes it outside).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

#include "sluice/core/clock.h"
#include "sluice/local/adaptive_guard.h"

namespace sluice::server {

enum class CallResult : std::uint8_t {
  kSuccess,   // the call finished: its RTT is latency evidence
  kDropped,   // the backend was overloaded (a timeout, a 503): the limit comes down
  kIgnored,   // says nothing about the backend (the client gave up, was cancelled)
  kFailed,    // failed, but not from overload: no latency evidence, a health signal
  kTimeout,   // dropped: the call timed out
  kOverload,  // dropped: the backend refused it as overloaded, fast (a 429, a 503)
};

// "success", "dropped", "ignored", "failed", "timeout", "overload".
[[nodiscard]] std::string_view to_string(CallResult r) noexcept;

// What an adaptive limit learns from a call: kFailed says nothing about overload or latency.
[[nodiscard]] constexpr Outcome to_outcome(CallResult r) noexcept {
  switch (r) {
    case CallResult::kSuccess:
      return Outcome::kSuccess;
    case CallResult::kDropped:
    case CallResult::kTimeout:
    case CallResult::kOverload:
      return Outcome::kDropped;
    case CallResult::kIgnored:
    case CallResult::kFailed:
      break;
  }
  return Outcome::kIgnored;
}

struct CallEnd {
  enum class By : std::uint8_t {
    kClient,    // Release
    kExpiry,    // the lease's TTL passed without a heartbeat
    kShutdown,  // the server stopped (or the permit was dropped unfinished)
  };
  CallResult result = CallResult::kIgnored;
  Nanos rtt{0};
  By by = By::kShutdown;
};

class LeasePermit {
 public:
  // The largest built-in permit: a gateway lease (its permit carries the levels it holds, 48
  // bytes, plus its generation and its policy).
  static constexpr std::size_t kInlineBytes = 72;

  LeasePermit() noexcept = default;

  template <class P>
  requires(!std::is_same_v<std::decay_t<P>, LeasePermit> &&
           std::is_nothrow_move_constructible_v<std::decay_t<P>> &&
           requires(std::decay_t<P> & p, const CallEnd& e) {
             { p.finish(e) }
             noexcept;
           }) explicit LeasePermit(P&& permit) noexcept {
    using T = std::decay_t<P>;
    static_assert(sizeof(T) <= kInlineBytes && alignof(T) <= alignof(std::max_align_t),
                  "a kind's permit must fit LeasePermit::kInlineBytes: box a larger one");
    ::new (static_cast<void*>(buf_)) T(std::forward<P>(permit));
    ops_ = &kOps<T>;
  }

  LeasePermit(LeasePermit&& other) noexcept { take(other); }
  LeasePermit& operator=(LeasePermit&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  LeasePermit(const LeasePermit&) = delete;
  LeasePermit& operator=(const LeasePermit&) = delete;
  ~LeasePermit() { reset(); }

  // Finishes the call (the first call only; later ones do nothing).
  void finish(const CallEnd& end) noexcept {
    if (ops_ == nullptr) return;
    const Ops* ops = std::exchange(ops_, nullptr);
    ops->finish(buf_, end);
    ops->destroy(buf_);
  }
  // Whether it holds a permit not yet finished.
  [[nodiscard]] bool held() const noexcept { return ops_ != nullptr; }
  // Whether its kind can renew it.
  [[nodiscard]] bool renewable() const noexcept {
    return ops_ != nullptr && ops_->renew != nullptr;
  }
  // Records the call as finish() would and keeps the permit for its client's next call;
  // returns whether that call is within the policy's limit. Not renewable: false, nothing done.
  bool renew(const CallEnd& end) noexcept { return renewable() && ops_->renew(buf_, end); }

 private:
  struct Ops {
    void (*finish)(void*, const CallEnd&) noexcept;
    bool (*renew)(void*, const CallEnd&) noexcept;  // null: the kind does not renew
    void (*move)(void* to, void* from) noexcept;    // move-constructs, then destroys `from`
    void (*destroy)(void*) noexcept;
  };
  template <class T>
  static constexpr bool (*renew_of())(void*, const CallEnd&) noexcept {
    if constexpr (requires(T & p, const CallEnd& e) {
                    { p.renew(e) }
                    noexcept->std::same_as<bool>;
                  })
      return [](void* p, const CallEnd& e) noexcept { return static_cast<T*>(p)->renew(e); };
    else
      return nullptr;
  }

  template <class T>
  static constexpr Ops kOps = {
      [](void* p, const CallEnd& e) noexcept { static_cast<T*>(p)->finish(e); }, renew_of<T>(),
      [](void* to, void* from) noexcept {
        ::new (to) T(std::move(*static_cast<T*>(from)));
        static_cast<T*>(from)->~T();
      },
      [](void* p) noexcept { static_cast<T*>(p)->~T(); }};

  void take(LeasePermit& other) noexcept {
    if (other.ops_ == nullptr) return;
    ops_ = std::exchange(other.ops_, nullptr);
    ops_->move(buf_, other.buf_);
  }
  void reset() noexcept { finish(CallEnd{}); }

  alignas(std::max_align_t) std::byte buf_[kInlineBytes];
  const Ops* ops_ = nullptr;
};

}  // namespace sluice::server
