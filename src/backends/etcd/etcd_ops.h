// etcd_ops.h (private to backends/etcd): the pieces of a Txn the etcd coordinators build, the
// names they give their keys, and the pause after a lost compare-and-swap.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
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

// etcd refuses a Txn of more than 128 operations (--max-txn-ops): the most deletes a coordinator
// adds to one (past it, what would be deleted is left to its lease or the next write).
inline constexpr std::size_t kMaxDeletes = 100;

}  // namespace sluice::etcd_detail
