// Federation's etcd coordinator: read the ledger and the origin in one Txn, run the escrow core
// here, write both back in a compare-and-swap Txn.
#include "sluice/backends/etcd_rate_coordinator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_ops.h"
#include "etcd/etcd_rpc.pb.h"
#include "etcd/sluice_records.pb.h"

namespace sluice {
namespace {

using etcd_detail::back_off;
using etcd_detail::EtcdClient;
using etcd_detail::put_op;
using etcd_detail::range_op;
using etcd_detail::steady_now;
using etcd_detail::SteadyTime;
using etcd_detail::unchanged;
using std::chrono::seconds;

constexpr const char* kDefaultPrefix = "sluice/fed/";
constexpr Nanos kMinIdle = std::chrono::minutes(1);  // a ledger is kept at least this long
// The shared lease is granted this much longer than a write needs, so that it serves writes for
// about this long before the next LeaseGrant.
constexpr seconds kLeaseReuse{60};

void to_record(const Ledger& l, etcd::LedgerRecord& r) {
  r.set_window_start(l.window_start);
  r.set_clock_high(l.clock_high);
  r.set_limit(l.spec.limit);
  r.set_period_ns(l.spec.period.count());
  r.set_granted(l.granted);
  r.set_returned(l.returned);
  r.set_forfeited(l.forfeited);
  for (const RegionLedger& g : l.regions) {
    auto* m = r.add_regions();
    m->set_region(g.region);
    m->set_granted(g.granted);
    m->set_relinquished(g.relinquished);
    m->set_relinquished_window(g.relinquished_window);
  }
}

bool from_record(const etcd::LedgerRecord& r, Ledger& l) {
  l.window_start = r.window_start();
  l.clock_high = r.clock_high();
  l.spec.limit = r.limit();
  l.spec.period = Nanos{r.period_ns()};
  l.granted = r.granted();
  l.returned = r.returned();
  l.forfeited = r.forfeited();
  l.regions.clear();
  for (const auto& m : r.regions()) {
    if (m.region().empty()) return false;
    l.regions.push_back({m.region(), m.granted(), m.relinquished(), m.relinquished_window()});
  }
  const auto by_region = [](const RegionLedger& a, const RegionLedger& b) {
    return a.region < b.region;
  };
  if (!std::is_sorted(l.regions.begin(), l.regions.end(), by_region))
    std::sort(l.regions.begin(), l.regions.end(), by_region);
  return true;
}

// How long a ledger written now must last: max(3 periods, kMinIdle).
Nanos keep_for(const Ledger& l) {
  const std::int64_t p = l.spec.period.count();
  return Nanos{p > INT64_MAX / 3 ? INT64_MAX : std::max(3 * p, kMinIdle.count())};
}

// a + b, saturated at INT64_MAX (b >= 0).
std::int64_t add_sat(std::int64_t a, std::int64_t b) {
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}

// How a compare-and-swap went: written, lost to another writer, or sent on a shared lease etcd
// no longer has (the next try grants another, with no pause).
enum class Wrote : std::uint8_t { kDone, kLostRace, kLeaseGone };

// What one read found.
struct Read {
  std::int64_t revision = 0;
  std::uint64_t cluster_id = 0;
  bool has_ledger = false;
  std::int64_t ledger_mod = 0;
  Ledger ledger;
  bool has_origin = false;
  std::int64_t origin_mod = 0;
  etcd::OriginRecord origin;
  bool rolled_back = false;      // the revision is below one this coordinator saw before the read
  std::int64_t seen_before = 0;  // the highest revision this coordinator had seen
};

}  // namespace

struct EtcdRateCoordinator::Impl {
  Impl(std::unique_ptr<EtcdClient> c, const Clock* clock)
      : client(std::move(c)),
        prefix(client->options().key_prefix),
        origin_key(prefix + "origin"),
        uncertainty(2 * client->options().max_clock_offset),
        caller_clock(clock) {}

  std::unique_ptr<EtcdClient> client;
  const std::string prefix;
  const std::string origin_key;
  const Nanos uncertainty;  // 2 x max_clock_offset
  const Clock* const caller_clock;
  // The highest revision any reply has shown: a later read at a lower one means etcd went back
  // (a restore from a snapshot).
  etcd_detail::RevisionMark high_water;
  std::atomic<std::uint64_t> conflicts{0};
  etcd_detail::SharedLease shared_lease;

  Nanos now() const { return caller_clock != nullptr ? caller_clock->now() : unix_ns_now(); }

  void note_revision(std::int64_t r) { high_water.note(r); }

  std::string ledger_key(std::string_view key) const {
    return etcd_detail::named(prefix, key) + "ledger";
  }

  StatusOr<Read> read(const std::string& key, SteadyTime deadline) {
    etcdserverpb::TxnRequest req;
    *req.add_success() = range_op(key);
    *req.add_success() = range_op(origin_key);
    const std::int64_t seen_before = high_water.seen();
    etcdserverpb::TxnResponse resp;
    if (Status s = client->txn(req, resp, deadline); !s.ok()) return s;
    if (resp.responses_size() != 2)
      return Status(StatusCode::kInternal, "etcd Txn: expected 2 replies to a read, got " +
                                               std::to_string(resp.responses_size()));
    Read out;
    out.revision = resp.header().revision();
    out.cluster_id = resp.header().cluster_id();
    const auto& ledger = resp.responses(0).response_range();
    if (ledger.kvs_size() > 0) {
      etcd::LedgerRecord r;
      if (!r.ParseFromString(ledger.kvs(0).value()) || !from_record(r, out.ledger))
        return Status(StatusCode::kInternal, "etcd: the value of " + key + " is not a ledger");
      out.has_ledger = true;
      out.ledger_mod = ledger.kvs(0).mod_revision();
    }
    const auto& origin = resp.responses(1).response_range();
    if (origin.kvs_size() > 0) {
      if (!out.origin.ParseFromString(origin.kvs(0).value()))
        return Status(StatusCode::kInternal,
                      "etcd: the value of " + origin_key + " is not an origin record");
      out.has_origin = true;
      out.origin_mod = origin.kvs(0).mod_revision();
    }
    out.seen_before = seen_before;
    out.rolled_back = out.revision < seen_before;
    note_revision(out.revision);
    return out;
  }

  // The caller's clock, or kFailedPrecondition when it is more than the uncertainty behind the
  // latest time a caller decided this key at.
  StatusOr<Nanos> caller_now(const Read& r, std::string_view key) const {
    const Nanos t = now();
    if (r.has_ledger && r.ledger.clock_high != INT64_MIN &&
        r.ledger.clock_high - t.count() > uncertainty.count())
      return Status(
          StatusCode::kFailedPrecondition,
          "etcd: this server's clock (" + std::to_string(t.count()) + " ns since the epoch) is " +
              std::to_string((r.ledger.clock_high - t.count()) / 1'000'000) +
              " ms behind the latest time a server decided key '" + std::string(key) + "' at (" +
              std::to_string(r.ledger.clock_high) + "), more than twice max_clock_offset (" +
              std::to_string(uncertainty.count() / 2'000'000) +
              " ms): a server's clock is off; check their time synchronisation");
    return t;
  }

  // The compare-and-swap of `r` with `ledger` (and, with `origin_at`, a new origin).
  StatusOr<Wrote> write(const std::string& key, const Read& r, const Ledger& ledger,
                        bool new_origin, std::int64_t origin_at, SteadyTime start,
                        SteadyTime deadline) {
    std::int64_t revision = 0;
    auto lease =
        shared_lease.covering(*client, keep_for(ledger), kLeaseReuse, start, deadline, revision);
    note_revision(revision);
    if (!lease.ok()) return lease.status();
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = unchanged(key, r.ledger_mod);
    *txn.add_compare() = unchanged(origin_key, r.origin_mod);
    etcd::LedgerRecord record;
    to_record(ledger, record);
    *txn.add_success() = put_op(key, record.SerializeAsString(), lease.value());
    if (new_origin) {
      etcd::OriginRecord o;
      o.set_cluster_id(r.cluster_id);
      o.set_lost_at_ns(origin_at);
      *txn.add_success() = put_op(origin_key, o.SerializeAsString());
    }
    etcdserverpb::TxnResponse resp;
    if (Status s = client->txn(txn, resp, deadline); !s.ok()) {
      if (s.code() != StatusCode::kNotFound) return s;
      shared_lease.forget(lease.value());  // gone (revoked, or etcd lost it)
      return Wrote::kLeaseGone;
    }
    note_revision(resp.header().revision());
    if (!resp.succeeded()) return Wrote::kLostRace;
    if (r.rolled_back) high_water.forget_old(r.seen_before, resp.header().revision());
    return Wrote::kDone;
  }

  // After a write that was not done: a lost race is counted and paused after.
  Status again(Wrote w, int attempt, SteadyTime deadline) {
    return w == Wrote::kLostRace ? lost_race(attempt, deadline) : Status{};
  }

  Status lost_race(int attempt, SteadyTime deadline) {
    conflicts.fetch_add(1, std::memory_order_relaxed);
    back_off(attempt, deadline);
    if (steady_now() >= deadline)
      return Status(StatusCode::kDeadlineExceeded,
                    "etcd: the compare-and-swap kept losing to other writers until the timeout (" +
                        std::to_string(attempt + 1) + " attempts)");
    return {};
  }

  StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request, SteadyTime start,
                             SteadyTime deadline) {
    const std::string k = ledger_key(key);
    LeaseRequest req = request;
    req.min_window_left = Nanos{add_sat(request.min_window_left.count(), uncertainty.count())};
    bool found_before = false;  // by an earlier attempt of this call
    for (int attempt = 0;; ++attempt) {
      auto r = read(k, deadline);
      if (!r.ok()) return r.status();
      Read& got = r.value();
      auto t = caller_now(got, key);
      if (!t.ok()) return t.status();
      const bool found = found_before || !got.has_origin ||
                         got.origin.cluster_id() != got.cluster_id || got.rolled_back;
      found_before = found;
      // No caller had read a later time than this when the loss was found.
      const std::int64_t decided_at = std::max(t.value().count(), got.ledger.clock_high);
      const std::int64_t origin_at =
          found ? add_sat(decided_at, uncertainty.count()) : got.origin.lost_at_ns();
      const Ledger before = got.ledger;
      LeaseReply reply = sluice::lease(got.ledger, req, t.value(),
                                       window_of(Nanos{origin_at}, req.spec.period).count());
      reply.clock_uncertainty = uncertainty;
      if (got.ledger == before && !found) return reply;  // nothing to write: the read decided it
      auto w = write(k, got, got.ledger, found, origin_at, start, deadline);
      if (!w.ok()) return w.status();
      if (w.value() == Wrote::kDone) return reply;
      if (Status s = again(w.value(), attempt, deadline); !s.ok()) return s;
    }
  }

  StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                    Nanos window_start, std::uint64_t relinquished,
                                    SteadyTime start, SteadyTime deadline) {
    const std::string k = ledger_key(key);
    for (int attempt = 0;; ++attempt) {
      auto r = read(k, deadline);
      if (!r.ok()) return r.status();
      Read& got = r.value();
      if (!got.has_ledger) return std::uint64_t{0};  // nothing leased here (or it was lost)
      auto t = caller_now(got, key);
      if (!t.ok()) return t.status();
      const Ledger before = got.ledger;
      const std::uint64_t given =
          sluice::reconcile(got.ledger, region, window_start, relinquished, t.value());
      if (got.ledger == before) return given;
      auto w = write(k, got, got.ledger, false, 0, start, deadline);
      if (!w.ok()) return w.status();
      if (w.value() == Wrote::kDone) return given;
      if (Status s = again(w.value(), attempt, deadline); !s.ok()) return s;
    }
  }
};

EtcdRateCoordinator::EtcdRateCoordinator(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
EtcdRateCoordinator::~EtcdRateCoordinator() = default;

EtcdOptions EtcdRateCoordinator::default_options() {
  EtcdOptions o;
  o.key_prefix = kDefaultPrefix;
  return o;
}

std::uint64_t EtcdRateCoordinator::conflicts() const noexcept {
  return impl_->conflicts.load(std::memory_order_relaxed);
}

StatusOr<std::unique_ptr<EtcdRateCoordinator>> EtcdRateCoordinator::open(
    EtcdOptions options, const Clock* caller_clock) {
  if (options.key_prefix.empty())
    return Status(StatusCode::kInvalidArgument, "key_prefix: must not be empty");
  if (options.max_clock_offset < Nanos{0})
    return Status(StatusCode::kInvalidArgument, "max_clock_offset: must not be negative");
  if (options.max_clock_offset > std::chrono::hours(1))
    return Status(StatusCode::kInvalidArgument,
                  "max_clock_offset: at most 1h (escrow ends twice it before its window)");
  auto client = EtcdClient::open(std::move(options));
  if (!client.ok()) return client.status();
  try {
    return std::unique_ptr<EtcdRateCoordinator>(
        new EtcdRateCoordinator(std::make_unique<Impl>(std::move(client.value()), caller_clock)));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd: ") + e.what());
  }
}

StatusOr<std::unique_ptr<EtcdRateCoordinator>> EtcdRateCoordinator::connect(
    EtcdOptions options, const Clock* caller_clock) {
  auto c = open(std::move(options), caller_clock);
  if (!c.ok()) return c;
  if (Status s = etcd_detail::connect_within_timeout(*c.value()->impl_->client); !s.ok()) return s;
  return c;
}

StatusOr<LeaseReply> EtcdRateCoordinator::lease(std::string_view key, const LeaseRequest& request,
                                                Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (std::string why = validate(request); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  try {
    const SteadyTime start = steady_now();
    return impl_->lease(key, request, start, start + timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd lease: ") + e.what());
  }
}

StatusOr<std::uint64_t> EtcdRateCoordinator::reconcile(std::string_view key,
                                                       std::string_view region, Nanos window_start,
                                                       std::uint64_t relinquished,
                                                       Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (region.empty()) return Status(StatusCode::kInvalidArgument, "region: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  try {
    const SteadyTime start = steady_now();
    return impl_->reconcile(key, region, window_start, relinquished, start, start + timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd reconcile: ") + e.what());
  }
}

Status EtcdRateCoordinator::health(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  try {
    etcdserverpb::TxnRequest req;
    *req.add_success() = range_op(impl_->origin_key);
    etcdserverpb::TxnResponse resp;
    return impl_->client->txn(req, resp, steady_now() + timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd health: ") + e.what());
  }
}

}  // namespace sluice
