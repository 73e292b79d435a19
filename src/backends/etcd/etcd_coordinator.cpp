// The etcd coordinator: read in one Txn, decide here, write in a compare-and-swap Txn.
#include "sluice/backends/etcd_coordinator.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/etcd/etcd_client.h"
#include "backends/etcd/etcd_ops.h"
#include "etcd/sluice_records.pb.h"

namespace sluice {
namespace {

using etcd_detail::back_off;
using etcd_detail::delete_op;
using etcd_detail::EtcdClient;
using etcd_detail::kMaxDeletes;
using etcd_detail::put_op;
using etcd_detail::range_op;
using etcd_detail::steady_now;
using etcd_detail::SteadyTime;
using etcd_detail::unchanged;
using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::seconds;

// How long a test-mode lease outlives its lease_ttl: liveness there is the caller's clock's.
constexpr seconds kTestModeLeaseExtra{60};
// A shared lease is granted this much longer than lease_ttl, so that it serves heartbeats for
// about this long.
constexpr seconds kLeaseReuse{1};
void to_record(const FleetState& s, etcd::FleetRecord& r) {
  r.set_generation(s.generation);
  r.set_ceiling(s.ceiling);
  for (const FleetNode& n : s.nodes) {
    auto* m = r.add_nodes();
    m->set_id(n.id);
    m->set_l_local(n.l_local);
    m->set_estimated(n.estimated);
    m->set_in_flight(n.in_flight);
    m->set_share(n.share);
    m->set_expires_at_ns(n.expires_at.count());
    m->set_acked_generation(n.acked_generation);
    for (const IssuedGrant& g : n.unacked) {
      m->add_unacked_generation(g.generation);
      m->add_unacked_share(g.share);
    }
    m->set_instance(n.instance);
  }
}

bool from_record(const etcd::FleetRecord& r, FleetState& s) {
  s.generation = r.generation();
  s.ceiling = r.ceiling();
  s.nodes.clear();
  for (const auto& m : r.nodes()) {
    if (m.unacked_generation_size() != m.unacked_share_size() || m.id().empty()) return false;
    FleetNode n;
    n.id = m.id();
    n.l_local = m.l_local();
    n.estimated = m.estimated();
    n.in_flight = m.in_flight();
    n.share = m.share();
    n.expires_at = Nanos{m.expires_at_ns()};
    n.acked_generation = m.acked_generation();
    for (int i = 0; i < m.unacked_generation_size(); ++i)
      n.unacked.push_back({m.unacked_generation(i), m.unacked_share(i)});
    n.instance = m.instance();
    s.nodes.push_back(std::move(n));
  }
  const auto by_id = [](const FleetNode& a, const FleetNode& b) { return a.id < b.id; };
  if (!std::is_sorted(s.nodes.begin(), s.nodes.end(), by_id))
    std::sort(s.nodes.begin(), s.nodes.end(), by_id);
  return true;
}

// A live key's value: the member's instance, in decimal.
bool parse_instance(const std::string& v, std::uint64_t& out) {
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc{} && p == v.data() + v.size();
}

struct LiveKey {
  std::uint64_t instance = 0;
  std::int64_t lease = 0;
};

// What one read found.
struct Read {
  std::int64_t revision = 0;
  std::uint64_t cluster_id = 0;
  bool has_state = false;
  std::int64_t state_mod = 0;
  FleetState state;
  std::map<std::string, LiveKey, std::less<>> live;  // by node id
  bool has_origin = false;
  std::int64_t origin_mod = 0;
  etcd::OriginRecord origin;
  bool recovering = false;
  bool rolled_back = false;      // the revision is below one this coordinator saw before the read
  std::int64_t seen_before = 0;  // the highest revision this coordinator had seen
};

}  // namespace

struct EtcdCoordinator::Impl {
  Impl(std::unique_ptr<EtcdClient> c, CoordinatorConfig cfg, const Clock* clock)
      : client(std::move(c)),
        config(cfg),
        caller_clock(clock),
        prefix(client->options().key_prefix),
        origin_key(prefix + "origin"),
        recovering_key(prefix + "recovering") {}

  const std::unique_ptr<EtcdClient> client;
  const CoordinatorConfig config;
  const Clock* const caller_clock;
  const std::string prefix, origin_key, recovering_key;

  // The highest revision a reply has carried: a later read below it found the records rolled
  // back (a restore from a snapshot).
  etcd_detail::RevisionMark high_water;
  std::atomic<std::uint64_t> conflicts{0};

  etcd_detail::SharedLease shared_lease;

  StatusOr<std::int64_t> lease_for(Nanos ttl, SteadyTime start, SteadyTime deadline) {
    std::int64_t revision = 0;
    auto id = shared_lease.covering(*client, ttl,
                                    caller_clock != nullptr ? kTestModeLeaseExtra : kLeaseReuse,
                                    start, deadline, revision);
    note_revision(revision);
    return id;
  }

  void forget_lease(std::int64_t id) { shared_lease.forget(id); }

  void note_revision(std::int64_t r) { high_water.note(r); }

  Nanos now() const { return caller_clock != nullptr ? caller_clock->now() : Nanos{0}; }

  // The key's state, its live keys (or only `only_id`'s), the origin and the recovering mark,
  // at one revision.
  StatusOr<Read> read(const std::string& base, std::string_view only_id, SteadyTime deadline) {
    etcdserverpb::TxnRequest req;
    *req.add_success() = range_op(base + "state");
    const std::string live = base + "live/";
    if (only_id.empty())
      *req.add_success() = etcd_detail::prefix_op(live);
    else
      *req.add_success() = range_op(live + std::string(only_id));
    *req.add_success() = range_op(origin_key);
    *req.add_success() = range_op(recovering_key);
    const std::int64_t seen_before = high_water.seen();
    etcdserverpb::TxnResponse resp;
    if (Status s = client->txn(req, resp, deadline); !s.ok()) return s;
    if (resp.responses_size() != 4)
      return Status(StatusCode::kInternal, "etcd Txn: expected 4 replies to a read, got " +
                                               std::to_string(resp.responses_size()));
    Read out;
    out.revision = resp.header().revision();
    out.cluster_id = resp.header().cluster_id();
    const auto& state = resp.responses(0).response_range();
    if (state.kvs_size() > 0) {
      etcd::FleetRecord r;
      if (!r.ParseFromString(state.kvs(0).value()) || !from_record(r, out.state))
        return Status(StatusCode::kInternal,
                      "etcd: the value of " + base + "state is not a fleet record");
      out.has_state = true;
      out.state_mod = state.kvs(0).mod_revision();
    }
    for (const auto& kv : resp.responses(1).response_range().kvs()) {
      LiveKey k;
      if (!parse_instance(kv.value(), k.instance))
        return Status(StatusCode::kInternal, "etcd: the value of " + kv.key() +
                                                 " is not a member instance (a decimal number)");
      k.lease = kv.lease();
      out.live.emplace(kv.key().substr(live.size()), k);
    }
    const auto& origin = resp.responses(2).response_range();
    if (origin.kvs_size() > 0) {
      if (!out.origin.ParseFromString(origin.kvs(0).value()))
        return Status(StatusCode::kInternal,
                      "etcd: the value of " + origin_key + " is not an origin record");
      out.has_origin = true;
      out.origin_mod = origin.kvs(0).mod_revision();
    }
    out.recovering = resp.responses(3).response_range().kvs_size() > 0;
    // A read sent after a reply at `seen_before` answers at that revision or later, unless the
    // records went back in time.
    out.seen_before = seen_before;
    out.rolled_back = out.revision < seen_before;
    note_revision(out.revision);
    return out;
  }

  // Whether the read finds a loss: no origin (first use, a wiped cluster), another cluster's, or
  // records that went back in time.
  static bool loss(const Read& r) {
    return !r.has_origin || r.origin.cluster_id() != r.cluster_id || r.rolled_back;
  }

  // Marks the nodes whose lease keys are gone as expired; in production every other node as
  // live (its lease says so), in test mode as its expires_at says.
  void apply_liveness(Read& r) const {
    for (FleetNode& n : r.state.nodes) {
      if (!r.live.contains(n.id))
        n.expires_at = Nanos::min();
      else if (caller_clock == nullptr)
        n.expires_at = Nanos::max();
    }
  }

  // When the coordinator last found a loss, as the core takes it.
  Nanos lost_at(const Read& r, bool found_now, Nanos t) const {
    if (caller_clock != nullptr) {
      if (found_now) return t;
      return r.has_origin ? Nanos{r.origin.lost_at_ns()} : kNeverLost;
    }
    return found_now || r.recovering ? t : kNeverLost;
  }

  StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report, SteadyTime start,
                            SteadyTime deadline) {
    const std::string base = etcd_detail::named(prefix, key);
    auto lease = lease_for(report.lease_ttl, start, deadline);
    if (!lease.ok()) return lease.status();
    bool found_before = false;  // by an earlier attempt of this heartbeat
    for (int attempt = 0;; ++attempt) {
      auto r = read(base, {}, deadline);
      if (!r.ok()) return r.status();
      Read& got = r.value();
      const Nanos t = now();
      // A report that acknowledges a generation the records never issued comes from a node
      // granted on records that are gone.
      const bool found =
          found_before || loss(got) || report.acked_generation > got.state.generation;
      found_before = found;
      apply_liveness(got);
      if (std::string why = clash(got.state, report, t); !why.empty()) {
        if (caller_clock == nullptr) why = clash_in_production(got, report, deadline);
        return Status(StatusCode::kAlreadyExists, std::move(why));
      }
      const std::vector<FleetNode> before = got.state.nodes;
      const Grant g = sluice::heartbeat(got.state, report, t, config, lost_at(got, found, t));
      etcdserverpb::TxnRequest txn;
      *txn.add_compare() = unchanged(base + "state", got.state_mod);
      *txn.add_compare() = unchanged(origin_key, got.origin_mod);
      etcd::FleetRecord record;
      to_record(got.state, record);
      *txn.add_success() = put_op(base + "state", record.SerializeAsString());
      *txn.add_success() =
          put_op(base + "live/" + report.node_id, std::to_string(report.instance), lease.value());
      if (found) {
        etcd::OriginRecord o;
        o.set_cluster_id(got.cluster_id);
        o.set_lost_at_ns(t.count());
        *txn.add_success() = put_op(origin_key, o.SerializeAsString());
        *txn.add_success() = put_op(recovering_key, "", lease.value());
      }
      std::size_t deletes = 0;
      for (const FleetNode& n : before) {
        const bool kept =
            std::binary_search(got.state.nodes.begin(), got.state.nodes.end(), n,
                               [](const FleetNode& a, const FleetNode& b) { return a.id < b.id; });
        if (!kept && got.live.contains(n.id) && deletes++ < kMaxDeletes)
          *txn.add_success() = delete_op(base + "live/" + n.id);
      }
      etcdserverpb::TxnResponse resp;
      if (Status s = client->txn(txn, resp, deadline); !s.ok()) {
        if (s.code() != StatusCode::kNotFound) return s;
        // The shared lease is gone (revoked, or etcd lost it): a new one, and once more.
        forget_lease(lease.value());
        lease = lease_for(report.lease_ttl, start, deadline);
        if (!lease.ok()) return lease.status();
        continue;
      }
      note_revision(resp.header().revision());
      if (resp.succeeded()) {
        if (got.rolled_back) high_water.forget_old(got.seen_before, resp.header().revision());
        return g;
      }
      conflicts.fetch_add(1, std::memory_order_relaxed);
      back_off(attempt, deadline);
      if (steady_now() >= deadline)
        return Status(StatusCode::kDeadlineExceeded,
                      "etcd: the heartbeat's compare-and-swap kept losing to other writers until "
                      "the timeout (" +
                          std::to_string(attempt + 1) + " attempts)");
    }
  }

  // clash()'s words with the time left on the holder's lease, as etcd tells it.
  std::string clash_in_production(const Read& r, const NodeReport& report, SteadyTime deadline) {
    const auto it = std::find_if(r.state.nodes.begin(), r.state.nodes.end(),
                                 [&](const FleetNode& n) { return n.id == report.node_id; });
    const std::uint64_t holder = it != r.state.nodes.end() ? it->instance : 0;
    Nanos left = Nanos{0};
    if (const auto live = r.live.find(report.node_id); live != r.live.end()) {
      etcdserverpb::LeaseTimeToLiveResponse ttl;
      if (client->lease_time_to_live(live->second.lease, ttl, deadline).ok() && ttl.ttl() > 0)
        left = seconds(ttl.ttl());
    }
    return clash_text(report.node_id, holder, left);
  }

  Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
               SteadyTime deadline) {
    const std::string base = etcd_detail::named(prefix, key);
    for (int attempt = 0;; ++attempt) {
      auto r = read(base, node_id, deadline);
      if (!r.ok()) return r.status();
      Read& got = r.value();
      if (!sluice::leave(got.state, node_id, instance)) return {};
      etcdserverpb::TxnRequest txn;
      *txn.add_compare() = unchanged(base + "state", got.state_mod);
      etcd::FleetRecord record;
      to_record(got.state, record);
      *txn.add_success() = put_op(base + "state", record.SerializeAsString());
      *txn.add_success() = delete_op(base + "live/" + std::string(node_id));
      etcdserverpb::TxnResponse resp;
      if (Status s = client->txn(txn, resp, deadline); !s.ok()) return s;
      note_revision(resp.header().revision());
      if (resp.succeeded()) return {};
      conflicts.fetch_add(1, std::memory_order_relaxed);
      back_off(attempt, deadline);
      if (steady_now() >= deadline)
        return Status(StatusCode::kDeadlineExceeded,
                      "etcd: the leave's compare-and-swap kept losing to other writers until the "
                      "timeout");
    }
  }
};

EtcdCoordinator::EtcdCoordinator(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
EtcdCoordinator::~EtcdCoordinator() = default;

const CoordinatorConfig& EtcdCoordinator::config() const noexcept { return impl_->config; }
std::uint64_t EtcdCoordinator::conflicts() const noexcept {
  return impl_->conflicts.load(std::memory_order_relaxed);
}
std::uint64_t EtcdCoordinator::leases_granted() const noexcept {
  return impl_->shared_lease.grants();
}

StatusOr<std::unique_ptr<EtcdCoordinator>> EtcdCoordinator::open(EtcdOptions options,
                                                                 CoordinatorConfig config,
                                                                 const Clock* caller_clock) {
  if (options.key_prefix.empty())
    return Status(StatusCode::kInvalidArgument, "key_prefix: must not be empty");
  auto client = EtcdClient::open(std::move(options));
  if (!client.ok()) return client.status();
  try {
    return std::unique_ptr<EtcdCoordinator>(new EtcdCoordinator(
        std::make_unique<Impl>(std::move(client.value()), config, caller_clock)));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd: ") + e.what());
  }
}

StatusOr<std::unique_ptr<EtcdCoordinator>> EtcdCoordinator::connect(EtcdOptions options,
                                                                    CoordinatorConfig config,
                                                                    const Clock* caller_clock) {
  auto c = open(std::move(options), config, caller_clock);
  if (!c.ok()) return c;
  if (Status s = etcd_detail::connect_within_timeout(*c.value()->impl_->client); !s.ok()) return s;
  return c;
}

StatusOr<Grant> EtcdCoordinator::heartbeat(std::string_view key, const NodeReport& report,
                                           Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (std::string why = validate(report); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  try {
    const SteadyTime start = steady_now();
    return impl_->heartbeat(key, report, start, start + timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd heartbeat: ") + e.what());
  }
}

Status EtcdCoordinator::leave(std::string_view key, std::string_view node_id,
                              std::uint64_t instance, Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (node_id.empty()) return Status(StatusCode::kInvalidArgument, "node_id must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  try {
    return impl_->leave(key, node_id, instance, steady_now() + timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("etcd leave: ") + e.what());
  }
}

}  // namespace sluice
