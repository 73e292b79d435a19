// The fleet's coordinator on etcd (sluice/backends/etcd_coordinator.h) against real etcd
// clusters the test starts on loopback: grants as the heartbeat core makes them, liveness by etcd
// leases (a silent node is evicted once its lease is gone, with no clock compared), a member id
// held by a live process refused, a first use, a wiped cluster and a restore from a snapshot
// each taken as a loss, servers racing on one key through compare-and-swap without breaking the
// global cap, and members that cannot be reached passed over. The cluster's faults (a leader
// killed under load) are EtcdClusterFaults, which holds the timing lock.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sluice/backends/etcd_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock_ = std::chrono::steady_clock;

constexpr Nanos kTimeout = seconds(5);

NodeReport report(const std::string& id, std::uint32_t l_local, std::uint64_t instance,
                  Nanos lease_ttl = seconds(1)) {
  NodeReport r;
  r.node_id = id;
  r.l_local = l_local;
  r.instance = instance;
  r.lease_ttl = lease_ttl;
  return r;
}

// Heartbeats until a loss's recovering window is over (a lease of 2 s or so), then leaves.
void past_first_use(EtcdCoordinator& c, const std::string& key) {
  const auto until = Clock_::now() + seconds(10);
  while (Clock_::now() < until) {
    auto g = c.heartbeat(key, report("warmup", 1, 1), kTimeout);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    if (!g.value().recovering) {
      ASSERT_TRUE(c.leave(key, "warmup", 1, kTimeout).ok());
      return;
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
  FAIL() << "still recovering 10 s after the loss";
}

class EtcdCoordinatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = std::make_unique<testing::EtcdCluster>();
    status_ = cluster_->start(1);
  }
  static void TearDownTestSuite() { cluster_.reset(); }
  void SetUp() override { ASSERT_TRUE(status_.ok()) << status_.to_string(); }

  // A coordinator on keys of its own (a fresh prefix per test: a fresh origin, so a first use).
  static EtcdOptions options(const std::string& prefix) {
    EtcdOptions o;
    o.endpoints = cluster_->endpoints();
    o.key_prefix = "test/" + prefix + "/";
    return o;
  }
  static std::unique_ptr<EtcdCoordinator> make(const std::string& prefix,
                                               CoordinatorConfig config = {}) {
    auto c = EtcdCoordinator::connect(options(prefix), config);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c.value()) : nullptr;
  }
  static std::unique_ptr<testing::EtcdCluster> cluster_;
  static Status status_;
};
std::unique_ptr<testing::EtcdCluster> EtcdCoordinatorTest::cluster_;
Status EtcdCoordinatorTest::status_;

TEST_F(EtcdCoordinatorTest, AFirstUseIsALossThenGrantsSplitTheAggregate) {
  auto c = make("split");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->backend(), "etcd");
  auto first = c->heartbeat("db", report("a", 10, 1), kTimeout);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_TRUE(first.value().recovering);  // an empty store: what nodes held is unknown
  EXPECT_EQ(first.value().share, 0u);
  ASSERT_NO_FATAL_FAILURE(past_first_use(*c, "db"));
  auto a = c->heartbeat("db", report("a", 10, 1), kTimeout);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_FALSE(a.value().recovering);
  EXPECT_EQ(a.value().share, 10u);
  auto b = c->heartbeat("db", report("b", 10, 2), kTimeout);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value().nodes, 2u);
  EXPECT_EQ(b.value().share, 0u);  // a holds 10 until its next heartbeat
  a = c->heartbeat("db", report("a", 10, 1), kTimeout);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().share, 5u);  // equal split: 10 / 2
  b = c->heartbeat("db", report("b", 10, 2), kTimeout);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value().share, 5u);
  EXPECT_GT(b.value().generation, a.value().generation);
  // A leave gives its share back at once.
  ASSERT_TRUE(c->leave("db", "b", 2, kTimeout).ok());
  a = c->heartbeat("db", report("a", 10, 1), kTimeout);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().nodes, 1u);
  EXPECT_EQ(a.value().share, 10u);
  // Keys are apart, including one whose name starts like another's encoded names.
  auto other = c->heartbeat("db/live/x", report("z", 4, 9), kTimeout);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other.value().nodes, 1u);
  a = c->heartbeat("db", report("a", 10, 1), kTimeout);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().nodes, 1u);
}

TEST_F(EtcdCoordinatorTest, ASilentNodeIsEvictedWhenItsLeaseExpiresNotBefore) {
  auto c = make("evict");
  ASSERT_NE(c, nullptr);
  ASSERT_NO_FATAL_FAILURE(past_first_use(*c, "db"));
  // b on a lease of 1 s (etcd rounds it up, plus the second a shared lease serves), then silent.
  ASSERT_TRUE(c->heartbeat("db", report("b", 8, 2), kTimeout).ok());
  const auto silent_since = Clock_::now();
  auto a = c->heartbeat("db", report("a", 8, 1), kTimeout);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().nodes, 2u);
  Nanos evicted_after{0};
  while (Clock_::now() - silent_since < seconds(15)) {
    std::this_thread::sleep_for(milliseconds(100));
    a = c->heartbeat("db", report("a", 8, 1), kTimeout);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    if (a.value().nodes == 1) {
      evicted_after = Clock_::now() - silent_since;
      break;
    }
  }
  ASSERT_GT(evicted_after, Nanos{0}) << "b was never evicted";
  // Never before its lease_ttl (b's fence), and within etcd's expiry of a 2-3 s lease.
  EXPECT_GE(evicted_after, seconds(1));
  EXPECT_LT(evicted_after, seconds(6));
  EXPECT_EQ(a.value().share, 8u);
  std::printf("[etcd] a node silent since its heartbeat evicted after %.2f s (lease_ttl 1 s)\n",
              std::chrono::duration<double>(evicted_after).count());
}

TEST_F(EtcdCoordinatorTest, AnIdALiveMemberHoldsIsRefusedNamingItAndFreedByItsLeave) {
  auto c = make("clash");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->heartbeat("db", report("n1", 6, 111), kTimeout).ok());
  auto twin = c->heartbeat("db", report("n1", 6, 222), kTimeout);
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(twin.status().message().find("n1"), std::string::npos) << twin.status().message();
  // A leave by another instance leaves the record alone; its own frees the id.
  ASSERT_TRUE(c->leave("db", "n1", 222, kTimeout).ok());
  EXPECT_FALSE(c->heartbeat("db", report("n1", 6, 222), kTimeout).ok());
  ASSERT_TRUE(c->leave("db", "n1", 111, kTimeout).ok());
  EXPECT_TRUE(c->heartbeat("db", report("n1", 6, 222), kTimeout).ok());
}

TEST_F(EtcdCoordinatorTest, AWipedOriginIsALoss) {
  auto c = make("wiped");
  ASSERT_NE(c, nullptr);
  ASSERT_NO_FATAL_FAILURE(past_first_use(*c, "db"));
  auto g = c->heartbeat("db", report("a", 5, 1), kTimeout);
  ASSERT_TRUE(g.ok());
  ASSERT_FALSE(g.value().recovering);
  ASSERT_EQ(cluster_->etcdctl({"del", "test/wiped/origin"}), 0);
  g = c->heartbeat("db", report("a", 5, 1), kTimeout);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g.value().recovering);
  EXPECT_EQ(g.value().share, 0u);
  // Another coordinator (another server) sees the window too, from the mark in etcd.
  auto other = make("wiped");
  ASSERT_NE(other, nullptr);
  auto b = other->heartbeat("db", report("b", 5, 2), kTimeout);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b.value().recovering);
}

TEST_F(EtcdCoordinatorTest, ServersRacingOnOneKeyKeepTheGlobalCap) {
  constexpr int kServers = 4, kBeats = 60;
  std::vector<std::unique_ptr<EtcdCoordinator>> servers;
  for (int i = 0; i < kServers; ++i) servers.push_back(make("race"));
  for (auto& s : servers) ASSERT_NE(s, nullptr);
  ASSERT_NO_FATAL_FAILURE(past_first_use(*servers[0], "db"));
  std::mutex mu;
  std::map<std::string, Grant> latest;  // each node's last grant, in the order etcd made them
  std::atomic<int> failures{0}, over{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kServers; ++i)
    threads.emplace_back([&, i] {
      for (int b = 0; b < kBeats; ++b) {
        const std::string id = "n" + std::to_string(i);
        NodeReport r = report(id, 20, static_cast<std::uint64_t>(i + 1), seconds(3));
        {
          std::lock_guard lock(mu);
          r.in_flight = latest[id].share;  // it uses all it was granted
          r.acked_generation = latest[id].generation;
        }
        auto g = servers[static_cast<std::size_t>(i)]->heartbeat("db", r, kTimeout);
        if (!g.ok()) {
          ++failures;
          continue;
        }
        std::lock_guard lock(mu);
        latest[id] = g.value();
        std::uint32_t held = 0;
        for (const auto& [_, grant] : latest) held += grant.share;
        if (held > 20) ++over;
      }
    });
  for (auto& t : threads) t.join();
  std::uint64_t conflicts = 0;
  for (auto& s : servers) conflicts += s->conflicts();
  std::printf("[etcd] %d servers x %d heartbeats on one key: %llu compare-and-swap conflicts\n",
              kServers, kBeats, static_cast<unsigned long long>(conflicts));
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(over.load(), 0);
  EXPECT_GT(conflicts, 0u);  // they did race
  // Leases are shared, not one per heartbeat.
  std::uint64_t grants = 0;
  for (auto& s : servers) grants += s->leases_granted();
  EXPECT_LT(grants, static_cast<std::uint64_t>(kServers * kBeats / 4));
}

TEST_F(EtcdCoordinatorTest, AMemberThatCannotBeReachedIsPassedOver) {
  EtcdOptions o = options("dead-member");
  o.endpoints.insert(o.endpoints.begin(), "127.0.0.1:" + std::to_string(testing::free_port()));
  o.connect_timeout = milliseconds(300);
  auto c = EtcdCoordinator::connect(o, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c.value()->heartbeat("db", report("a", 5, 1), kTimeout).ok());
  // None at all: unavailable, naming the member.
  EtcdOptions none = options("dead");
  none.endpoints = {"127.0.0.1:" + std::to_string(testing::free_port())};
  none.connect_timeout = milliseconds(300);
  auto dead = EtcdCoordinator::connect(none, {});
  ASSERT_FALSE(dead.ok());
  EXPECT_EQ(dead.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(dead.status().message().find(none.endpoints[0]), std::string::npos)
      << dead.status().message();
  auto opened = EtcdCoordinator::open(none, {});
  ASSERT_TRUE(opened.ok());
  const auto g = opened.value()->heartbeat("db", report("a", 5, 1), milliseconds(500));
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(g.status().code() == StatusCode::kUnavailable ||
              g.status().code() == StatusCode::kDeadlineExceeded)
      << g.status().to_string();
}

TEST_F(EtcdCoordinatorTest, OptionsItCannotUseAreRefusedNamingTheField) {
  const auto refused = [](EtcdOptions o, const std::string& field) {
    auto c = EtcdCoordinator::open(std::move(o), {});
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status().message();
  };
  EtcdOptions o;
  o.endpoints = {};
  refused(o, "endpoints");
  o.endpoints = {"localhost"};
  refused(o, "endpoints");
  o.endpoints = {"127.0.0.1:0"};
  refused(o, "endpoints");
  o = EtcdOptions{};
  o.key_prefix = "";
  refused(o, "key_prefix");
  o = EtcdOptions{};
  o.connect_timeout = Nanos{0};
  refused(o, "connect_timeout");
  o = EtcdOptions{};
  o.username = "root";
  refused(o, "password");
}

// A restore from an etcd snapshot takes every record back to the snapshot: what the nodes were
// granted since is forgotten, and a coordinator that has seen a later revision finds it.
TEST(EtcdRestore, ARestoreFromASnapshotIsALoss) {
  testing::EtcdCluster cluster;
  ASSERT_TRUE(cluster.start(1).ok());
  EtcdOptions o;
  o.endpoints = cluster.endpoints();
  o.key_prefix = "restore/";
  auto c = EtcdCoordinator::connect(o, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_NO_FATAL_FAILURE(past_first_use(*c.value(), "db"));
  const std::string snap = ::testing::TempDir() + "sluice-etcd-restore.db";
  ASSERT_TRUE(cluster.snapshot(snap).ok());
  // After the snapshot, b joins and is granted half; a heartbeats on.
  Grant b_grant;
  for (int i = 0; i < 3; ++i) {
    auto b = c.value()->heartbeat("db", report("b", 10, 2), kTimeout);
    ASSERT_TRUE(b.ok());
    b_grant = b.value();
    ASSERT_TRUE(c.value()->heartbeat("db", report("a", 10, 1), kTimeout).ok());
  }
  ASSERT_GT(b_grant.share, 0u);
  const Status restored = cluster.restore(snap);
  ASSERT_TRUE(restored.ok()) << restored.to_string();
  std::remove(snap.c_str());
  // A server started after the restore (a new coordinator), and b's report acknowledging a
  // generation the restored records never issued.
  auto fresh = EtcdCoordinator::connect(o, {});
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  NodeReport b = report("b", 10, 2);
  b.in_flight = b_grant.share;
  b.acked_generation = b_grant.generation;
  auto by_ack = fresh.value()->heartbeat("db", b, kTimeout);
  ASSERT_TRUE(by_ack.ok()) << by_ack.status().to_string();
  EXPECT_TRUE(by_ack.value().recovering);
  EXPECT_EQ(by_ack.value().share, 0u);
  // On a second restore, the server that saw the later revisions finds it by itself, for a node
  // that acknowledges nothing (taken once the first loss's window has passed, so that the
  // snapshot holds no mark of it).
  ASSERT_NO_FATAL_FAILURE(past_first_use(*c.value(), "db"));
  ASSERT_TRUE(cluster.snapshot(snap).ok());
  // Many writes after the snapshot: the restored revisions stay below the ones this server saw
  // for as many writes again.
  for (int i = 0; i < 200; ++i)
    ASSERT_TRUE(c.value()->heartbeat("db", report("a", 10, 1), kTimeout).ok());
  // A longer lease than the shared one covers: the server's lease is now one the restore drops,
  // so the heartbeat that finds the restore loses its first write and must find it again.
  ASSERT_TRUE(c.value()->heartbeat("db", report("a", 10, 1, seconds(30)), kTimeout).ok());
  ASSERT_TRUE(cluster.restore(snap).ok());
  std::remove(snap.c_str());
  auto by_revision = c.value()->heartbeat("db", report("new", 10, 3), kTimeout);
  ASSERT_TRUE(by_revision.ok()) << by_revision.status().to_string();
  EXPECT_TRUE(by_revision.value().recovering);  // the records went back: grants are unknown
  EXPECT_EQ(by_revision.value().share, 0u);
  // Found once: the window ends one lease_ttl later, not when the revisions catch up.
  ASSERT_NO_FATAL_FAILURE(past_first_use(*c.value(), "db"));
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// etcd's authentication on (simple tokens that live 1 s): a user with its password and a role
// on the coordinator's prefix is served, again after its token expired (the client asks for a
// new one); a wrong password is refused naming the user; a prefix outside the role's is refused.
TEST(EtcdAuth, AUserIsServedAcrossTokenExpiryAndAWrongPasswordOrPrefixIsRefused) {
  testing::EtcdCluster cluster;
  const Status started = cluster.start(1, 1000, {"--auth-token-ttl", "1"});
  ASSERT_TRUE(started.ok()) << started.to_string();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"user", "add", "root:rootpw", "--interactive=false"},
        {"user", "add", "sluice:s3cret", "--interactive=false"},
        {"role", "add", "fleet"},
        {"role", "grant-permission", "fleet", "--prefix=true", "readwrite", "auth/"},
        {"user", "grant-role", "sluice", "fleet"},
        {"auth", "enable"}}) {
    std::string out;
    ASSERT_EQ(cluster.etcdctl(args, &out), 0) << args[0] << " " << args[1] << ": " << out;
  }
  EtcdOptions o;
  o.endpoints = cluster.endpoints();
  o.key_prefix = "auth/";
  o.username = "sluice";
  o.password = "s3cret";
  auto c = EtcdCoordinator::connect(o, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto g = c.value()->heartbeat("db", report("a", 5, 1), kTimeout);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  std::this_thread::sleep_for(milliseconds(2500));  // the token has expired
  g = c.value()->heartbeat("db", report("a", 5, 1), kTimeout);
  ASSERT_TRUE(g.ok()) << g.status().to_string();

  EtcdOptions wrong = o;
  wrong.password = "nope";
  auto refused = EtcdCoordinator::connect(wrong, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("'sluice'"), std::string::npos)
      << refused.status().message();

  EtcdOptions elsewhere = o;
  elsewhere.key_prefix = "other/";
  auto outside = EtcdCoordinator::connect(elsewhere, {});
  ASSERT_TRUE(outside.ok()) << outside.status().to_string();
  const auto denied = outside.value()->heartbeat("db", report("a", 5, 1), kTimeout);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied) << denied.status().to_string();
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// A CA, a member certificate for 127.0.0.1 and a client certificate, made with openssl into
// `dir`; false if openssl failed.
bool make_certificates(const std::string& dir) {
  const std::string script =
      "set -e; cd '" + dir +
      "'; "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "-subj /CN=sluice-test-ca 2>/dev/null; "
      "for who in server client; do "
      "openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj /CN=$who "
      "2>/dev/null; done; "
      "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' > server.ext; "
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; "
      "for who in server client; do "
      "openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem "
      "-days 2 -extfile $who.ext 2>/dev/null; done";
  return std::system(script.c_str()) == 0;
}

// Members that serve clients over TLS and ask for a client certificate: a coordinator with the
// CA and a client certificate is served; one without the client certificate, one without TLS
// and one with a CA that did not sign the members' are not; files it cannot read are named.
TEST(EtcdTls, ACoordinatorWithTheCaAndAClientCertificateIsServedAndNoOtherIs) {
  const std::string dir = ::testing::TempDir() + "sluice-etcd-tls-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(make_certificates(dir)) << "openssl failed in " << dir;
  testing::EtcdCluster cluster;
  cluster.use_tls(dir + "/server.pem", dir + "/server.key", dir + "/ca.pem", dir + "/ca.pem",
                  dir + "/client.pem", dir + "/client.key");
  const Status started = cluster.start(1);
  ASSERT_TRUE(started.ok()) << started.to_string();
  EtcdOptions o;
  o.endpoints = cluster.endpoints();
  o.key_prefix = "tls/";
  o.ca_file = dir + "/ca.pem";
  o.cert_file = dir + "/client.pem";
  o.key_file = dir + "/client.key";
  // A TLS handshake under AddressSanitizer, beside another suite's test, once took longer than
  // 1.5 s ("handshaker shutdown"): what is tested is who is served, not how fast.
  o.connect_timeout = milliseconds(5000);
  auto c = EtcdCoordinator::connect(o, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c.value()->heartbeat("db", report("a", 5, 1), kTimeout).ok());

  const auto refused = [](EtcdOptions x, const std::string& what) {
    x.connect_timeout = milliseconds(700);
    auto r = EtcdCoordinator::connect(std::move(x), {});
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_TRUE(r.status().code() == StatusCode::kUnavailable ||
                r.status().code() == StatusCode::kPermissionDenied)
        << what << ": " << r.status().to_string();
  };
  EtcdOptions no_client_cert = o;
  no_client_cert.cert_file.clear();
  no_client_cert.key_file.clear();
  refused(no_client_cert, "without the client certificate");
  EtcdOptions plain = o;
  plain.ca_file.clear();
  plain.cert_file.clear();
  plain.key_file.clear();
  refused(plain, "without TLS");
  EtcdOptions other_ca = o;
  other_ca.ca_file = dir + "/client.pem";  // a certificate that signed nothing of the members'
  refused(other_ca, "with another CA");

  EtcdOptions missing = o;
  missing.ca_file = dir + "/nothing.pem";
  auto m = EtcdCoordinator::open(missing, {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().rfind("ca_file:", 0), 0u) << m.status().message();
  EtcdOptions half = o;
  half.key_file.clear();
  auto h = EtcdCoordinator::open(half, {});
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("key_file"), std::string::npos) << h.status().message();
  cluster.stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice
