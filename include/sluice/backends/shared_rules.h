// shared_rules.h: rules set at run time, shared by every server that names one coordinator
// (memory, Redis, PostgreSQL, etcd): the throttler's per-app rules and skipped hosts.
//
// What it is: per scope (a throttler's shard), a table of key -> (value, deadline). The value is
// opaque text (the caller's JSON); the deadline is a time held on the backend's clock, so that
// servers whose clocks disagree agree on when a rule ends to within one call's latency: put()
// takes the time left until it and list() hands back the time left then. An entry put with
// `drop_at_deadline` is gone once its deadline passes (a throttle and nothing else); without it,
// the deadline is only data (an app's throttle ends, its exemption stays). etcd has no clock to
// lend: there the deadline is held on the writer's wall clock and read against the reader's, so
// servers agree on it to within their clocks' offset (NTP keeps it to milliseconds).
//
// Bounds (checked by every backend, an error names the field): a scope is 1 to 256 bytes, a key
// 1 to 512, a value at most 64 KiB; a put of a new key into a scope that holds `max_keys` keys (the
// ones past a dropping deadline not counted) is kFailedPrecondition, atomically with the count.
//
// Storage: memory keeps the tables in the process (one server's: nothing is shared, for tests
// and the embedded default); Redis one hash per scope, "<key_prefix>{<scope>}" (default prefix
// "sluice:rules:"), each field's value "<deadline ms on Redis's clock, 0: none> <0|1> <value>";
// PostgreSQL one table named by its table_prefix (default "sluice_rules"; columns scope, key,
// value, deadline_ms, drop_at_deadline), created on first use; etcd one key per entry,
// "<key_prefix><length of scope>:<scope>/k/<key>" (default prefix "sluice/rules/"), beside a
// marker "<...scope>/n" that every put of a new key moves in the same compare-and-swap Txn (so
// the count and the put are one), an entry that drops on a lease that ends just after its
// deadline (it is cleared from etcd too). Neither needs persistence settings
// beyond the backend's defaults: a lost entry is a rule lost (an app runs unthrottled), never a
// check wrongly allowed past the metrics.
//
// Errors are values (sluice/core/status.h), never exceptions: kInvalidArgument for bad input,
// kFailedPrecondition for a full scope, kUnavailable when the backend cannot be reached,
// kDeadlineExceeded when the call did not finish within `timeout`.
//
// Thread-safety: every implementation is safe to call from any number of threads; changes to one
// scope are serialised by the backend, so two servers changing one key leave one of the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/etcd_options.h"
#include "sluice/core/postgres_options.h"
#include "sluice/core/redis_options.h"
#include "sluice/core/status.h"

namespace sluice {

// One entry as list() hands it back.
struct SharedRule {
  std::string key;
  std::string value;
  bool has_deadline = false;
  // The time from the backend's now to the deadline (negative: past it); 0 without one.
  Nanos left{0};
  bool drop_at_deadline = false;
};

class SharedRules {
 public:
  static constexpr std::size_t kMaxScopeBytes = 256;
  static constexpr std::size_t kMaxKeyBytes = 512;
  static constexpr std::size_t kMaxValueBytes = 64 * 1024;

  virtual ~SharedRules() = default;

  // Every entry of `scope`, in key order, less the ones whose dropping deadline has passed.
  [[nodiscard]] virtual StatusOr<std::vector<SharedRule>> list(std::string_view scope,
                                                               Nanos timeout) noexcept = 0;
  // Sets `key` of `scope` to `value` with a deadline `left` from the backend's now (nullopt
  // semantics: has_deadline false). `max_keys` bounds the scope's keys (see above).
  [[nodiscard]] virtual Status put(std::string_view scope, std::string_view key,
                                   std::string_view value, bool has_deadline, Nanos left,
                                   bool drop_at_deadline, std::size_t max_keys,
                                   Nanos timeout) noexcept = 0;
  // Removes `key` of `scope`; ok when there is none.
  [[nodiscard]] virtual Status erase(std::string_view scope, std::string_view key,
                                     Nanos timeout) noexcept = 0;
  // "memory", "redis", "postgres": for stats and logs.
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;

  // What put() refuses before any I/O (empty: nothing), shared by the backends.
  [[nodiscard]] static Status check(std::string_view scope, std::string_view key,
                                    std::string_view value);
};

// The embedded backend: this process's tables, on `clock` (which must outlive it).
[[nodiscard]] std::unique_ptr<SharedRules> memory_shared_rules(const Clock& clock);

// RedisOptions and PostgresOptions with the rule tables' defaults (key prefix "sluice:rules:",
// table "sluice_rules": for PostgreSQL the table_prefix is the table's whole name).
[[nodiscard]] RedisOptions redis_shared_rules_options();
[[nodiscard]] PostgresOptions postgres_shared_rules_options();
// On one Redis server, hiredis; connects on the first call (an error now only for bad options).
[[nodiscard]] StatusOr<std::unique_ptr<SharedRules>> redis_shared_rules(RedisOptions options);
// On one PostgreSQL server, libpq; connects (and creates its table) on the first call.
[[nodiscard]] StatusOr<std::unique_ptr<SharedRules>> postgres_shared_rules(PostgresOptions options);
// EtcdOptions with the rules' default key prefix ("sluice/rules/").
[[nodiscard]] EtcdOptions etcd_shared_rules_options();
// On an etcd cluster, gRPC (library sluice::etcd); connects on the first call.
[[nodiscard]] StatusOr<std::unique_ptr<SharedRules>> etcd_shared_rules(EtcdOptions options);

}  // namespace sluice
