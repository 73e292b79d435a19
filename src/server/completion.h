// completion.h: a decision that may finish later, without holding a thread while it waits.
//
// What it is: most calls are decided inline, on the transport thread that received them. A
// kind that cannot decide one now (a federated check of a key with no escrow needs one bounded
// coordinator round trip) defers it: it calls `later.defer()`, which hands it a Completion, and
// returns no decision. The transport parks the call (a gRPC reactor not yet finished, an HTTP
// session suspended in its coroutine) and answers when the Completion is called. The common case
// costs nothing: the Completion is only made (and only allocates) when a call is deferred.
//
//   Once<R(A...)>      a move-only callable, called at most once (std::function must copy).
//   Completion<T>      Once<void(StatusOr<T>)>: how a deferred call is finished.
//   Deferral<T>        what the caller offers: defer() takes the call over, at most once;
//                      on_cancel() tells the kind when the caller has gone.
//   Decided<T>         std::optional<StatusOr<T>>: the answer now, or nullopt when deferred.
//   OneShot<V>         a value set once from any thread and waited for on another (for callers
//                      that may block: in-process callers and tests).
//
// The contract of a kind that defers: it calls the Completion exactly once, from any thread,
// within a bound it documents (its coordinator timeout), and also when it is retired (a retired
// policy finishes what it holds, e.g. UNAVAILABLE). A call can reach a policy as it is being
// retired (the engine took it from the set a reload is replacing): the kind checks retired()
// under the lock its on_retire() drains with, and answers such a call now instead of parking
// it where nothing would answer it. Views in the call (a key) are valid only
// until the kind returns: a kind that defers copies what it needs.
//
// Thread-safety: a Once is owned by one thread at a time; it may be moved to and called on any.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "sluice/core/status.h"

namespace sluice::server {

template <class Sig>
class Once;

template <class R, class... A>
class Once<R(A...)> {
 public:
  Once() noexcept = default;
  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, Once> && std::is_invocable_r_v<R, F&, A...>)
      Once(F&& f)  // NOLINT(google-explicit-constructor): a lambda converts, as to std::function
      : impl_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(f))) {}

  Once(Once&&) noexcept = default;
  Once& operator=(Once&&) noexcept = default;

  [[nodiscard]] explicit operator bool() const noexcept { return impl_ != nullptr; }

  // Calls it; it is empty afterwards. Calling an empty Once is a bug (it is checked: nothing
  // happens and R{} is returned).
// GCC 12 warns, wrongly, that a StatusOr moved through a devirtualized call here "may be used
// uninitialized" (its std::variant's inactive member), depending on what the caller inlines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  R operator()(A... args) {
    std::unique_ptr<Base> f = std::move(impl_);
    if (f == nullptr) {
      if constexpr (std::is_void_v<R>)
        return;
      else
        return R{};
    }
    return f->call(std::forward<A>(args)...);
  }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

 private:
  struct Base {
    virtual ~Base() = default;
    virtual R call(A... args) = 0;
  };
  template <class F>
  struct Impl final : Base {
    explicit Impl(F f) : fn(std::move(f)) {}
    R call(A... args) override { return fn(std::forward<A>(args)...); }
    F fn;
  };
  std::unique_ptr<Base> impl_;
};

template <class T>
using Completion = Once<void(StatusOr<T>)>;

template <class T>
using Decided = std::optional<StatusOr<T>>;

template <class T>
class Deferral {
 public:
  // Takes the call over: the caller answers when the returned Completion is called. At most once
  // per call.
  [[nodiscard]] virtual Completion<T> defer() = 0;
  // After defer(): `hook` is called (at most once, from any thread) if the caller goes away
  // before the Completion is called (a cancelled gRPC call, a closed HTTP connection), so that
  // a kind holding the call (a queue) can let it go at once. The Completion must still be
  // called; its answer then reaches no one. A transport that cannot tell drops the hook
  // (the default).
  virtual void on_cancel(Once<void()> hook) { (void)hook; }

 protected:
  ~Deferral() = default;
};

// A value delivered once, through setter(), and waited for by get(). Its shared state is only
// made by setter() (a caller whose answer came inline allocates nothing); the setter keeps it
// alive, so it may outlive the OneShot.
template <class V>
class OneShot {
 public:
  [[nodiscard]] Once<void(V)> setter() {
    state_ = std::make_shared<State>();
    return [s = state_](V v) {
      {
        const std::lock_guard lock(s->mu);
        s->value.emplace(std::move(v));
      }
      s->cv.notify_all();
    };
  }
  // Blocks until the setter was called; then the value (once). Precondition: setter() was
  // taken.
  [[nodiscard]] V get() {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->value.has_value(); });
    return std::move(*state_->value);
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<V> value;
  };
  std::shared_ptr<State> state_;
};

// A decision that arrives on another thread after a kind's check_or_defer() may or may not have
// returned: whichever comes second answers (the returning call with the decision, or the callback
// through the Completion the call deferred to). Shared between the two; `mu` guards the rest.
template <class T>
struct Handoff {
  std::mutex mu;
  bool returned = false;
  std::optional<T> early;
  Completion<T> later;
};

}  // namespace sluice::server
