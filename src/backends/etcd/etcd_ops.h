// etcd_ops.h (private to backends/etcd): the pieces of a Txn the etcd coordinators build, the
// names they give their keys, and the pause after a lost compare-and-swap.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include "backends/etcd/etcd_client.h"
#include "etcd/etcd_rpc.pb.h"

namespace sluice::etcd_detail {

// "<prefix><length of name>:<name>/": no name's keys fall under another's.
inline std::string named(const std::string& prefix, std::string_view name) {
  std::string out = prefix;
  out += std::to_string(name.size());
  out += ':';
  out += name;
  out += '/';
  return out;
}

inline etcdserverpb::RequestOp range_op(const std::string& key, const std::string& range_end = {}) {
  etcdserverpb::RequestOp op;
  auto* r = op.mutable_request_range();
  r->set_key(key);
  if (!range_end.empty()) r->set_range_end(range_end);
  return op;
}

// Every key that starts with `prefix`.
inline etcdserverpb::RequestOp prefix_op(const std::string& prefix) {
  return range_op(prefix, prefix_end(prefix));
}

inline etcdserverpb::RequestOp put_op(const std::string& key, std::string value,
                                      std::int64_t lease = 0) {
  etcdserverpb::RequestOp op;
  auto* p = op.mutable_request_put();
  p->set_key(key);
  p->set_value(std::move(value));
  p->set_lease(lease);
  return op;
}

inline etcdserverpb::RequestOp delete_op(const std::string& key) {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  return op;
}

// Holds when `key`'s mod_revision is still `mod` (0: the key is still absent).
inline etcdserverpb::Compare unchanged(const std::string& key, std::int64_t mod) {
  etcdserverpb::Compare c;
  c.set_key(key);
  c.set_target(etcdserverpb::Compare::MOD);
  c.set_result(etcdserverpb::Compare::EQUAL);
  c.set_mod_revision(mod);
  return c;
}

// The pause after the attempt-th lost compare-and-swap: up to 1, 2, 4 .. 64 ms at random, within
// the deadline.
inline void back_off(int attempt, SteadyTime deadline) {
  thread_local std::minstd_rand rng(std::random_device{}());
  const Nanos cap = std::chrono::milliseconds(1 << std::min(attempt, 6));
  const Nanos pause = cap * static_cast<std::int64_t>(rng() % 1000 + 1) / 1000;
  std::this_thread::sleep_for(std::min(deadline - steady_now(), pause));
}

// The lease a coordinator puts its keys on: one for all of them while it still lasts what a call
// needs, so that a call costs a LeaseGrant only every `extra` or so.
class SharedLease {
 public:
  // A lease that lasts at least `need` from `start`: the shared one while it does, else a new one
  // of `need` rounded up to whole seconds plus `extra` (etcd counts whole seconds). `revision`
  // gets a new grant's revision.
  StatusOr<std::int64_t> covering(EtcdClient& client, Nanos need, std::chrono::seconds extra,
                                  SteadyTime start, SteadyTime deadline, std::int64_t& revision) {
    {
      std::lock_guard lock(mu_);
      if (id_ != 0 && asked_ + ttl_ >= start + need) return id_;
    }
    auto whole = std::chrono::duration_cast<std::chrono::seconds>(need);
    if (whole < need) whole += std::chrono::seconds(1);
    whole += extra;
    const SteadyTime asked = steady_now();
    etcdserverpb::LeaseGrantResponse resp;
    if (Status s = client.lease_grant(whole.count(), resp, deadline); !s.ok()) return s;
    if (!resp.error().empty())
      return Status(StatusCode::kUnavailable, "etcd LeaseGrant: " + resp.error());
    grants_.fetch_add(1, std::memory_order_relaxed);
    revision = resp.header().revision();
    std::lock_guard lock(mu_);
    id_ = resp.id();
    asked_ = asked;
    ttl_ = std::chrono::seconds(resp.ttl());  // etcd may grant more than asked, never less
    if (asked_ + ttl_ < start + need)
      return Status(StatusCode::kInternal, "etcd LeaseGrant: granted a TTL of " +
                                               std::to_string(resp.ttl()) + " s, asked for " +
                                               std::to_string(whole.count()) + " s");
    return id_;
  }

  // The lease `id` is gone (etcd answered that it is not found): the next call grants another.
  void forget(std::int64_t id) {
    std::lock_guard lock(mu_);
    if (id_ == id) id_ = 0;
  }

  // LeaseGrant calls made.
  [[nodiscard]] std::uint64_t grants() const noexcept {
    return grants_.load(std::memory_order_relaxed);
  }

 private:
  std::mutex mu_;
  std::int64_t id_ = 0;  // 0: none
  SteadyTime asked_{};   // when it was asked for (before the request went)
  Nanos ttl_{0};
  std::atomic<std::uint64_t> grants_{0};
};

// The highest revision a coordinator's replies have shown: a later read at a lower one means etcd
// went back (a restore from a snapshot, which keeps the cluster id).
class RevisionMark {
 public:
  [[nodiscard]] std::int64_t seen() const noexcept { return high_.load(std::memory_order_relaxed); }
  void note(std::int64_t r) noexcept {
    std::int64_t seen = high_.load(std::memory_order_relaxed);
    while (r > seen && !high_.compare_exchange_weak(seen, r, std::memory_order_relaxed)) {
    }
  }
  // Once a rollback found at a read made with the mark at `old_mark` is written to the records,
  // the revisions seen before belong to a line that is gone: the mark comes down to the write's
  // revision, so that the next reads do not find the same loss again. Not before: until then
  // every call must keep finding it. A mark moved by another thread since is left as it is.
  void forget_old(std::int64_t old_mark, std::int64_t recorded_at) noexcept {
    high_.compare_exchange_strong(old_mark, recorded_at, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::int64_t> high_{0};
};

// Waits for a member of `client`'s cluster in touch with a quorum, at most connect_timeout.
inline Status connect_within_timeout(EtcdClient& client) {
  Status s = client.connect(steady_now() + client.options().connect_timeout);
  if (s.code() == StatusCode::kDeadlineExceeded)
    return Status(StatusCode::kUnavailable, s.message() + " (connect_timeout)");
  return s;
}

// etcd refuses a Txn of more than 128 operations (--max-txn-ops): the most deletes a coordinator
// adds to one (past it, what would be deleted is left to its lease or the next write).
inline constexpr std::size_t kMaxDeletes = 100;

}  // namespace sluice::etcd_detail
