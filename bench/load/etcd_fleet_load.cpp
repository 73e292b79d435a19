// sluice_etcd_fleet_load: fleet heartbeats per second through sluice's etcd coordinator, against a
// raw gRPC loop doing the same compare-and-swap on the same etcd in the same run.
//
// --nodes N threads, each a server of its own (its own coordinator, its own gRPC channel), each
// heartbeat a closed loop on --keys keys (1: every node on one key, the contended case; N: a key
// per node), for --seconds each side. The raw loop is what a hand-written etcd fleet does at the
// least, on one channel per thread: a Txn reading the key's record and its lease keys, then a
// Txn that puts the record (the same bytes sluice writes) and the node's lease key if the
// record's mod_revision is unchanged, after the same jittered pause on a conflict; no decoding
// and no heartbeat core. sluice adds those, the origin's checks and a LeaseGrant about once a
// second per server.
//
// --federation: federation's leases instead (sluice's EtcdRateCoordinator, each node a region
// leasing one unit at a time of a budget that does not run out). The raw loop then reads the
// key's ledger and the origin in one Txn and puts a ledger of the size sluice writes if both
// mod_revisions are unchanged.
//
// Runs on a single-member etcd cluster this tool starts (or --members M), fsync as etcd does it.
// Usage: sluice_etcd_fleet_load [--federation] [--nodes N] [--keys K] [--seconds S] [--members M]
// Prints one line of key=value pairs: each side's heartbeats (or leases) per second, their
// ratio, and conflicts per heartbeat.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "etcd/etcd_rpc.grpc.pb.h"
#include "sluice/backends/etcd_coordinator.h"
#include "sluice/backends/etcd_rate_coordinator.h"
#include "sluice/testing/servers.h"

namespace {

using Steady = std::chrono::steady_clock;

struct Options {
  int nodes = 8;
  int keys = 1;
  double seconds = 5;
  int members = 1;
  bool federation = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "sluice_etcd_fleet_load: %s\nusage: sluice_etcd_fleet_load [--federation] [--nodes "
               "N] [--keys K] [--seconds S] [--members M]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--federation")
      o.federation = true;
    else if (a == "--nodes")
      o.nodes = std::atoi(value().c_str());
    else if (a == "--keys")
      o.keys = std::atoi(value().c_str());
    else if (a == "--seconds")
      o.seconds = std::atof(value().c_str());
    else if (a == "--members")
      o.members = std::atoi(value().c_str());
    else
      usage("unknown argument " + a);
  }
  if (o.nodes < 1 || o.keys < 1 || o.keys > o.nodes || !(o.seconds > 0) || o.members < 1)
    usage("--nodes >= 1, 1 <= --keys <= --nodes, --seconds > 0, --members >= 1");
  return o;
}

struct Result {
  double per_second = 0;
  double conflicts_per_beat = 0;
  long failures = 0;
};

// sluice: one EtcdCoordinator per node.
Result run_sluice(const Options& o, const std::vector<std::string>& endpoints) {
  std::vector<std::unique_ptr<sluice::EtcdCoordinator>> servers;
  for (int i = 0; i < o.nodes; ++i) {
    sluice::EtcdOptions eo;
    eo.endpoints = endpoints;
    eo.key_prefix = "bench/sluice/";
    auto c = sluice::EtcdCoordinator::connect(eo, {});
    if (!c.ok()) usage("cannot connect: " + c.status().to_string());
    servers.push_back(std::move(c.value()));
  }
  // Past the first use's window (a fresh store is a loss: grants are 0 for a lease_ttl).
  sluice::NodeReport warm{"warm", 10, 0, 0, std::chrono::seconds(1), true, 1};
  while (true) {
    auto g = servers[0]->heartbeat("warm", warm, std::chrono::seconds(5));
    if (!g.ok()) usage("warm-up: " + g.status().to_string());
    if (!g.value().recovering) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::atomic<long> beats{0}, failures{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  const auto start = Steady::now();
  for (int i = 0; i < o.nodes; ++i)
    threads.emplace_back([&, i] {
      sluice::NodeReport r{
          "node-" + std::to_string(i),      100, 0, 0, std::chrono::seconds(3), true,
          static_cast<std::uint64_t>(i + 1)};
      const std::string key = "key-" + std::to_string(i % o.keys);
      while (!done.load(std::memory_order_relaxed)) {
        auto g = servers[static_cast<std::size_t>(i)]->heartbeat(key, r, std::chrono::seconds(5));
        if (!g.ok()) {
          ++failures;
          continue;
        }
        r.in_flight = g.value().share;
        r.acked_generation = g.value().generation;
        ++beats;
      }
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  done = true;
  for (auto& t : threads) t.join();
  const double took = std::chrono::duration<double>(Steady::now() - start).count();
  std::uint64_t conflicts = 0;
  for (auto& s : servers) conflicts += s->conflicts();
  Result out;
  out.per_second = static_cast<double>(beats.load()) / took;
  out.conflicts_per_beat =
      beats.load() > 0 ? static_cast<double>(conflicts) / static_cast<double>(beats.load()) : 0;
  out.failures = failures.load();
  return out;
}

// sluice's federation: one EtcdRateCoordinator per node (a region of its own).
Result run_sluice_federation(const Options& o, const std::vector<std::string>& endpoints) {
  std::vector<std::unique_ptr<sluice::EtcdRateCoordinator>> regions;
  for (int i = 0; i < o.nodes; ++i) {
    sluice::EtcdOptions eo = sluice::EtcdRateCoordinator::default_options();
    eo.endpoints = endpoints;
    eo.key_prefix = "bench/sluice-fed/";
    auto c = sluice::EtcdRateCoordinator::connect(eo);
    if (!c.ok()) usage("cannot connect: " + c.status().to_string());
    regions.push_back(std::move(c.value()));
  }
  const auto request = [](int i) {
    sluice::LeaseRequest r;
    r.region = "region-" + std::to_string(i);
    r.spec = {std::uint64_t{1} << 50, std::chrono::seconds(1)};
    r.want = 1;
    return r;
  };
  // Past the first use's window (a fresh store is a loss: its window counts as spent).
  while (true) {
    auto g = regions[0]->lease("warm", request(0), std::chrono::seconds(5));
    if (!g.ok()) usage("warm-up: " + g.status().to_string());
    if (g.value().status == sluice::LeaseStatus::kGranted) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::atomic<long> leases{0}, failures{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  const auto start = Steady::now();
  for (int i = 0; i < o.nodes; ++i)
    threads.emplace_back([&, i] {
      const sluice::LeaseRequest r = request(i);
      const std::string key = "key-" + std::to_string(i % o.keys);
      while (!done.load(std::memory_order_relaxed)) {
        auto g = regions[static_cast<std::size_t>(i)]->lease(key, r, std::chrono::seconds(5));
        if (!g.ok()) {
          ++failures;
          continue;
        }
        ++leases;
      }
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  done = true;
  for (auto& t : threads) t.join();
  const double took = std::chrono::duration<double>(Steady::now() - start).count();
  std::uint64_t conflicts = 0;
  for (auto& r : regions) conflicts += r->conflicts();
  Result out;
  out.per_second = static_cast<double>(leases.load()) / took;
  out.conflicts_per_beat =
      leases.load() > 0 ? static_cast<double>(conflicts) / static_cast<double>(leases.load()) : 0;
  out.failures = failures.load();
  return out;
}

// The raw loop: read, then compare-and-swap, on one channel per thread.
Result run_raw(const Options& o, const std::vector<std::string>& endpoints) {
  std::atomic<long> beats{0}, conflicts{0}, failures{0};
  std::atomic<bool> done{false};
  // The record sluice writes for a key of N nodes is about 30 bytes a node; a ledger about 50,
  // and 25 a region.
  const int per_key = std::max(1, o.nodes / o.keys);
  const std::string record(
      static_cast<std::size_t>(o.federation ? 50 + 25 * per_key : 30 * per_key), 'r');
  std::vector<std::thread> threads;
  const auto start = Steady::now();
  for (int i = 0; i < o.nodes; ++i)
    threads.emplace_back([&, i] {
      auto channel = grpc::CreateChannel(endpoints[static_cast<std::size_t>(i) % endpoints.size()],
                                         grpc::InsecureChannelCredentials());
      auto kv = etcdserverpb::KV::NewStub(channel);
      auto lease = etcdserverpb::Lease::NewStub(channel);
      std::int64_t lease_id = 0;
      {
        grpc::ClientContext ctx;
        etcdserverpb::LeaseGrantRequest req;
        req.set_ttl(60);
        etcdserverpb::LeaseGrantResponse resp;
        if (lease->LeaseGrant(&ctx, req, &resp).ok()) lease_id = resp.id();
      }
      const std::string base = "bench/raw/key-" + std::to_string(i % o.keys) + "/";
      const std::string live = base + "live/", live_end = base + "live0";
      // Federation: the ledger beside the one origin key, both compared.
      const std::string record_key = base + (o.federation ? "ledger" : "state");
      const std::string origin_key = "bench/raw/origin";
      std::minstd_rand rng(static_cast<unsigned>(i + 1));
      int attempt = 0;
      while (!done.load(std::memory_order_relaxed)) {
        etcdserverpb::TxnRequest read;
        read.add_success()->mutable_request_range()->set_key(record_key);
        auto* lr = read.add_success()->mutable_request_range();
        lr->set_key(o.federation ? origin_key : live);
        if (!o.federation) lr->set_range_end(live_end);
        etcdserverpb::TxnResponse got;
        grpc::ClientContext rctx;
        if (!kv->Txn(&rctx, read, &got).ok() || got.responses_size() != 2) {
          ++failures;
          continue;
        }
        const auto& state = got.responses(0).response_range();
        const std::int64_t mod = state.kvs_size() > 0 ? state.kvs(0).mod_revision() : 0;
        etcdserverpb::TxnRequest cas;
        auto* c = cas.add_compare();
        c->set_key(record_key);
        c->set_target(etcdserverpb::Compare::MOD);
        c->set_result(etcdserverpb::Compare::EQUAL);
        c->set_mod_revision(mod);
        auto* p = cas.add_success()->mutable_request_put();
        p->set_key(record_key);
        p->set_value(record);
        if (o.federation) {
          const auto& origin = got.responses(1).response_range();
          auto* oc = cas.add_compare();
          oc->set_key(origin_key);
          oc->set_target(etcdserverpb::Compare::MOD);
          oc->set_result(etcdserverpb::Compare::EQUAL);
          oc->set_mod_revision(origin.kvs_size() > 0 ? origin.kvs(0).mod_revision() : 0);
          p->set_lease(lease_id);
        } else {
          auto* l = cas.add_success()->mutable_request_put();
          l->set_key(live + std::to_string(i));
          l->set_value(std::to_string(i + 1));
          l->set_lease(lease_id);
        }
        etcdserverpb::TxnResponse put;
        grpc::ClientContext wctx;
        if (!kv->Txn(&wctx, cas, &put).ok()) {
          ++failures;
          continue;
        }
        if (put.succeeded()) {
          ++beats;
          attempt = 0;
          continue;
        }
        ++conflicts;
        // The same pause as sluice's: up to 1, 2, 4 .. 64 ms at random.
        const auto cap = std::chrono::milliseconds(1 << std::min(attempt++, 6));
        std::this_thread::sleep_for(cap * static_cast<std::int64_t>(rng() % 1000 + 1) / 1000);
      }
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  done = true;
  for (auto& t : threads) t.join();
  const double took = std::chrono::duration<double>(Steady::now() - start).count();
  Result out;
  out.per_second = static_cast<double>(beats.load()) / took;
  out.conflicts_per_beat =
      beats.load() > 0 ? static_cast<double>(conflicts.load()) / static_cast<double>(beats.load())
                       : 0;
  out.failures = failures.load();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  sluice::testing::EtcdCluster cluster;
  if (sluice::Status s = cluster.start(o.members); !s.ok()) usage(s.to_string());
  const std::vector<std::string> endpoints = cluster.endpoints();
  const Result raw = run_raw(o, endpoints);
  const Result ours = o.federation ? run_sluice_federation(o, endpoints) : run_sluice(o, endpoints);
  std::printf(
      "%snodes=%d keys=%d members=%d seconds=%.1f sluice_per_s=%.0f raw_per_s=%.0f ratio=%.2f "
      "sluice_conflicts_per_beat=%.2f raw_conflicts_per_beat=%.2f sluice_failures=%ld "
      "raw_failures=%ld\n",
      o.federation ? "federation " : "", o.nodes, o.keys, o.members, o.seconds, ours.per_second,
      raw.per_second, raw.per_second > 0 ? ours.per_second / raw.per_second : 0,
      ours.conflicts_per_beat, raw.conflicts_per_beat, ours.failures, raw.failures);
  return ours.failures == 0 && raw.failures == 0 ? 0 : 1;
}
