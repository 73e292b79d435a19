// Shared rules on etcd (sluice/backends/shared_rules.h): one key per entry, a scope's marker moved
// by every put of a new key in the same compare-and-swap Txn, deadlines on the wall clock.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_ops.h"
#include "etcd/sluice_records.pb.h"
#include "sluice/backends/shared_rules.h"

namespace sluice {
namespace {

using etcd_detail::EtcdClient;
using etcd_detail::steady_now;
using etcd_detail::SteadyTime;

// What a scope's read found.
struct Scope {
  struct Entry {
    std::string key;  // the rule's own key, without the prefix
    etcd::RuleRecord record;
    std::int64_t mod = 0;
  };
  std::vector<Entry> entries;  // in key order, the dropped ones too
  std::int64_t marker_mod = 0;
};

bool dropped(const etcd::RuleRecord& r, std::int64_t now_ms) {
  return r.has_deadline() && r.drop_at_deadline() && r.deadline_unix_ms() <= now_ms;
}

class EtcdSharedRules final : public SharedRules {
 public:
  explicit EtcdSharedRules(std::unique_ptr<EtcdClient> client)
      : client_(std::move(client)), prefix_(client_->options().key_prefix) {}

  StatusOr<std::vector<SharedRule>> list(std::string_view scope, Nanos timeout) noexcept override {
    if (Status s = check(scope, "k", ""); !s.ok()) return s;
    try {
      auto read = read_scope(scope, steady_now() + timeout);
      if (!read.ok()) return read.status();
      const std::int64_t now_ms = unix_ms_now();
      std::vector<SharedRule> out;
      for (const Scope::Entry& e : read.value().entries) {
        if (dropped(e.record, now_ms)) continue;
        const bool has = e.record.has_deadline();
        out.push_back({e.key, e.record.value(), has,
                       has ? Nanos(std::chrono::milliseconds(e.record.deadline_unix_ms() - now_ms))
                           : Nanos{0},
                       has && e.record.drop_at_deadline()});
      }
      return out;
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("etcd: rules list: ") + e.what());
    }
  }

  Status put(std::string_view scope, std::string_view key, std::string_view value,
             bool has_deadline, Nanos left, bool drop_at_deadline, std::size_t max_keys,
             Nanos timeout) noexcept override {
    if (Status s = check(scope, key, value); !s.ok()) return s;
    try {
      const SteadyTime deadline = steady_now() + timeout;
      const std::string base = etcd_detail::named(prefix_, scope);
      const std::string target = base + "k/" + std::string(key);
      for (int attempt = 0;; ++attempt) {
        auto read = read_scope(scope, deadline);
        if (!read.ok()) return read.status();
        const std::int64_t now_ms = unix_ms_now();
        std::size_t live = 0;
        std::int64_t target_mod = 0;
        bool held = false;  // the key is there and not dropped: a change, not a new key
        std::vector<std::string> sweep;
        for (const Scope::Entry& e : read.value().entries) {
          const bool gone = dropped(e.record, now_ms);
          if (e.key == key) {
            target_mod = e.mod;
            held = !gone;
          }
          if (!gone)
            ++live;
          else if (e.key != key && sweep.size() < etcd_detail::kMaxDeletes)
            sweep.push_back(base + "k/" + e.key);
        }
        if (!held && live >= max_keys)
          return Status(StatusCode::kFailedPrecondition, "scope " + std::string(scope) + " holds " +
                                                             std::to_string(live) +
                                                             " keys, the most it may");
        etcd::RuleRecord r;
        r.set_value(std::string(value));
        r.set_has_deadline(has_deadline);
        const std::int64_t left_ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
        if (has_deadline) r.set_deadline_unix_ms(now_ms + left_ms);
        r.set_drop_at_deadline(has_deadline && drop_at_deadline);
        // An entry that drops goes with a lease that ends just after its deadline, so etcd
        // clears it too (a second after, in whole seconds as etcd counts).
        std::int64_t lease = 0;
        if (r.drop_at_deadline()) {
          etcdserverpb::LeaseGrantResponse granted;
          const std::int64_t ttl = std::max<std::int64_t>(left_ms, 0) / 1000 + 2;
          if (Status s = client_->lease_grant(ttl, granted, deadline); !s.ok()) return s;
          lease = granted.id();
        }
        etcdserverpb::TxnRequest txn;
        *txn.add_compare() = etcd_detail::unchanged(base + "n", read.value().marker_mod);
        *txn.add_compare() = etcd_detail::unchanged(target, target_mod);
        *txn.add_success() = etcd_detail::put_op(target, r.SerializeAsString(), lease);
        if (!held) *txn.add_success() = etcd_detail::put_op(base + "n", "");
        for (const std::string& k : sweep) *txn.add_success() = etcd_detail::delete_op(k);
        etcdserverpb::TxnResponse resp;
        if (Status s = client_->txn(txn, resp, deadline); !s.ok()) return s;
        if (resp.succeeded()) return {};
        etcd_detail::back_off(attempt, deadline);
        if (steady_now() >= deadline)
          return Status(StatusCode::kDeadlineExceeded,
                        "etcd: the rule's compare-and-swap kept losing to other writers until "
                        "the timeout");
      }
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("etcd: rules put: ") + e.what());
    }
  }

  Status erase(std::string_view scope, std::string_view key, Nanos timeout) noexcept override {
    if (Status s = check(scope, key, ""); !s.ok()) return s;
    try {
      etcdserverpb::TxnRequest txn;
      *txn.add_success() =
          etcd_detail::delete_op(etcd_detail::named(prefix_, scope) + "k/" + std::string(key));
      etcdserverpb::TxnResponse resp;
      return client_->txn(txn, resp, steady_now() + timeout);
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("etcd: rules erase: ") + e.what());
    }
  }

  std::string_view backend() const noexcept override { return "etcd"; }

 private:
  // Every entry of `scope` and its marker, at one revision.
  StatusOr<Scope> read_scope(std::string_view scope, SteadyTime deadline) {
    const std::string base = etcd_detail::named(prefix_, scope);
    etcdserverpb::TxnRequest req;
    *req.add_success() = etcd_detail::prefix_op(base + "k/");
    *req.add_success() = etcd_detail::range_op(base + "n");
    etcdserverpb::TxnResponse resp;
    if (Status s = client_->txn(req, resp, deadline); !s.ok()) return s;
    if (resp.responses_size() != 2)
      return Status(StatusCode::kInternal, "etcd Txn: expected 2 replies to a read, got " +
                                               std::to_string(resp.responses_size()));
    Scope out;
    const std::size_t skip = base.size() + 2;  // "k/"
    for (const auto& kv : resp.responses(0).response_range().kvs()) {
      Scope::Entry e;
      if (!e.record.ParseFromString(kv.value()))
        return Status(StatusCode::kInternal,
                      "etcd: the value of " + kv.key() + " is not a shared rule record");
      e.key = kv.key().substr(skip);
      e.mod = kv.mod_revision();
      out.entries.push_back(std::move(e));
    }
    const auto& marker = resp.responses(1).response_range();
    if (marker.kvs_size() > 0) out.marker_mod = marker.kvs(0).mod_revision();
    return out;
  }

  const std::unique_ptr<EtcdClient> client_;
  const std::string prefix_;
};

}  // namespace

EtcdOptions etcd_shared_rules_options() {
  EtcdOptions o;
  o.key_prefix = "sluice/rules/";
  return o;
}

StatusOr<std::unique_ptr<SharedRules>> etcd_shared_rules(EtcdOptions options) {
  if (options.key_prefix.empty())
    return Status(StatusCode::kInvalidArgument, "key_prefix: must not be empty");
  auto client = EtcdClient::open(std::move(options));
  if (!client.ok()) return client.status();
  try {
    return std::unique_ptr<SharedRules>(new EtcdSharedRules(std::move(client.value())));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd: ") + e.what());
  }
}

}  // namespace sluice
