#include "sluice/testing/servers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

extern char** environ;

namespace sluice::testing {
namespace {

namespace fs = std::filesystem;
constexpr const char* kPgBin = "/usr/lib/postgresql/15/bin";

std::string make_temp_dir(const char* stem) {
  std::string pattern = (fs::temp_directory_path() / (std::string(stem) + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) return {};
  return pattern;
}

std::string tail(const std::string& path, std::size_t max = 2000) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max ? s.substr(s.size() - max) : s;
}

// Starts argv[0] (looked up on PATH) with stdout and stderr appended to `log` and no other file
// of this process open; the child's pid.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // none of the test's sockets or pipes
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// Runs a command to completion; its exit code (or -1).
int run(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = spawn(args, log);
  if (pid < 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool port_accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

bool alive(pid_t pid) { return pid > 0 && ::kill(pid, 0) == 0; }

// Signals `pid` and waits up to 10 s for it to go; reaps it if it is our child.
void stop_pid(pid_t pid, int sig) {
  if (pid <= 0) return;
  ::kill(pid, sig);
  for (int i = 0; i < 1000; ++i) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid || !alive(pid)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Starts a guard for `server` (started by this process, its files in `dir`): if this process
// ends while the server still runs (a crash, or a test runner's SIGKILL on timeout, where no
// destructor runs), the guard sends the server `sig`, SIGKILL 5 s later if it is still there,
// and removes `dir`. The guard is detached (the shell that starts it exits at once), so a runner
// that kills this process's children does not take the guard along; it exits by itself within
// a second of the server's ending while this process lives.
void start_guard(pid_t server, int sig, const std::string& dir) {
  static constexpr const char* kGuard = R"((
  while kill -0 "$1" 2>/dev/null; do
    kill -0 "$2" 2>/dev/null || exit 0
    sleep 1
  done
  kill -"$3" "$2" 2>/dev/null
  i=0
  while kill -0 "$2" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  kill -9 "$2" 2>/dev/null
  rm -rf "$4"
) </dev/null >/dev/null 2>&1 &)";
  run({"/bin/sh", "-c", kGuard, "sluice-test-guard", std::to_string(::getpid()),
       std::to_string(server), std::to_string(sig), dir},
      "/dev/null");
}

// Runs the server `args` (output to `log`) and waits up to 5 s for it to accept on `port`: its
// pid, guarded (stopped with SIGTERM and `dir` removed should this process die first); 0 when
// it did not listen in time (it is killed); -1 when it could not be run.
pid_t start_listening(const std::vector<std::string>& args, const std::string& log, int port,
                      const std::string& dir) {
  const pid_t pid = spawn(args, log);
  if (pid < 0) return -1;
  for (int i = 0; i < 500 && alive(pid); ++i) {
    if (port_accepts(port)) {
      start_guard(pid, SIGTERM, dir);
      return pid;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop_pid(pid, SIGKILL);
  return 0;
}

// SIGTERM to `pid` (when running), then its directory removed.
void stop_and_remove(pid_t& pid, std::string& dir) {
  if (pid > 0) stop_pid(pid, SIGTERM);
  pid = -1;
  if (!dir.empty()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    dir.clear();
  }
}

}  // namespace

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// ---- Redis ----

RedisServer::~RedisServer() { stop(); }

Status RedisServer::start(std::string password, int port, std::vector<std::string> extra) {
  dir_ = make_temp_dir("sluice-redis");
  if (dir_.empty()) return Status(StatusCode::kInternal, "cannot create a temp dir for redis");
  password_ = std::move(password);
  extra_ = std::move(extra);
  return launch(port);
}

void RedisServer::kill() {
  if (pid_ > 0) stop_pid(pid_, SIGKILL);
  pid_ = -1;
}

Status RedisServer::restart() {
  if (dir_.empty() || port_ == 0) return Status(StatusCode::kInternal, "redis: never started");
  kill();
  return launch(port_);
}

Status RedisServer::launch(int port) {
  const std::string log = dir_ + "/redis.log";
  for (int attempt = 0; attempt < (port > 0 ? 1 : 3); ++attempt) {
    port_ = port > 0 ? port : free_port();
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir_,
                                     "--daemonize",
                                     "no"};
    if (!password_.empty()) {
      args.push_back("--requirepass");
      args.push_back(password_);
    }
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = start_listening(args, log, port_, dir_);
    if (pid_ < 0) return Status(StatusCode::kUnavailable, "cannot run redis-server (installed?)");
    if (pid_ > 0) return {};
    pid_ = -1;
  }
  return Status(StatusCode::kUnavailable, "redis-server did not start: " + tail(log));
}

void RedisServer::stop() { stop_and_remove(pid_, dir_); }

RedisSentinel::~RedisSentinel() { stop(); }

Status RedisSentinel::start(int primary_port, const std::string& master_name, int quorum,
                            int down_after_ms, int failover_timeout_ms) {
  dir_ = make_temp_dir("sluice-sentinel");
  if (dir_.empty()) return Status(StatusCode::kInternal, "cannot create a temp dir for sentinel");
  const std::string log = dir_ + "/sentinel.log";
  const std::string conf = dir_ + "/sentinel.conf";  // a sentinel rewrites its own config
  for (int attempt = 0; attempt < 3; ++attempt) {
    port_ = free_port();
    {
      std::ofstream out(conf, std::ios::trunc);
      out << "port " << port_ << "\nbind 127.0.0.1\ndaemonize no\ndir " << dir_
          << "\nsentinel resolve-hostnames no\nsentinel monitor " << master_name << " 127.0.0.1 "
          << primary_port << " " << quorum << "\nsentinel down-after-milliseconds " << master_name
          << " " << down_after_ms << "\nsentinel failover-timeout " << master_name << " "
          << failover_timeout_ms << "\nsentinel parallel-syncs " << master_name << " 1\n";
      if (!out) return Status(StatusCode::kInternal, "cannot write " + conf);
    }
    pid_ = start_listening({"redis-server", conf, "--sentinel"}, log, port_, dir_);
    if (pid_ < 0) return Status(StatusCode::kUnavailable, "cannot run redis-server (installed?)");
    if (pid_ > 0) return {};
    pid_ = -1;
  }
  return Status(StatusCode::kUnavailable, "redis sentinel did not start: " + tail(log));
}

void RedisSentinel::stop() { stop_and_remove(pid_, dir_); }

// ---- PostgreSQL ----

PostgresServer::~PostgresServer() { stop(); }

std::string PostgresServer::conninfo() const {
  return "host=127.0.0.1 port=" + std::to_string(port_) + " user=" + user_ +
         " dbname=postgres connect_timeout=5";
}

Status PostgresServer::start() {
  dir_ = make_temp_dir("sluice-pg");
  if (dir_.empty()) return Status(StatusCode::kInternal, "cannot create a temp dir for postgres");
  const bool root = ::geteuid() == 0;
  std::vector<std::string> as;  // prefix running a command as the server's user
  if (root) {
    const passwd* pw = ::getpwnam("postgres");
    if (pw == nullptr) return Status(StatusCode::kUnavailable, "no postgres user (installed?)");
    ::chmod(dir_.c_str(), 0755);
    if (::chown(dir_.c_str(), pw->pw_uid, pw->pw_gid) != 0)
      return Status(StatusCode::kInternal, "cannot chown the postgres temp dir");
    as = {"runuser", "-u", "postgres", "--"};
    user_ = "postgres";
  } else {
    const passwd* pw = ::getpwuid(::geteuid());
    user_ = pw != nullptr ? pw->pw_name : "postgres";
  }
  auto cmd = [&](std::vector<std::string> args) {
    std::vector<std::string> full = as;
    full.insert(full.end(), args.begin(), args.end());
    return full;
  };
  const std::string data = dir_ + "/data", log = dir_ + "/server.log";
  const std::string init_log = dir_ + "/initdb.log";
  if (root) {
    // The logs are written by the postgres user.
    for (const std::string& f : {log, init_log}) {
      std::ofstream(f).flush();
      const passwd* pw = ::getpwnam("postgres");
      if (::chown(f.c_str(), pw->pw_uid, pw->pw_gid) != 0)
        return Status(StatusCode::kInternal, "cannot chown " + f);
    }
  }
  if (run(cmd({std::string(kPgBin) + "/initdb", "-D", data, "-U", user_, "--auth=trust", "-E",
               "UTF8", "--locale=C.UTF-8"}),
          init_log) != 0)
    return Status(StatusCode::kUnavailable, "initdb failed: " + tail(init_log));
  for (int attempt = 0; attempt < 3; ++attempt) {
    port_ = free_port();
    const std::string opts = "-p " + std::to_string(port_) +
                             " -c listen_addresses=127.0.0.1 -c unix_socket_directories=" + dir_ +
                             " -c fsync=off -c synchronous_commit=off -c full_page_writes=off";
    if (run(cmd({std::string(kPgBin) + "/pg_ctl", "-D", data, "-l", log, "-w", "-t", "30", "-o",
                 opts, "start"}),
            dir_ + "/pg_ctl.log") == 0) {
      std::ifstream pidfile(data + "/postmaster.pid");
      pidfile >> pid_;
      if (pid_ > 0 && port_accepts(port_)) {
        start_guard(pid_, SIGINT, dir_);  // fast shutdown
        return {};
      }
    }
    if (pid_ > 0) stop_pid(pid_, SIGINT);
    pid_ = -1;
  }
  return Status(StatusCode::kUnavailable, "postgres did not start: " + tail(log));
}

void PostgresServer::stop() {
  if (pid_ > 0) stop_pid(pid_, SIGINT);  // fast shutdown
  pid_ = -1;
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    dir_.clear();
  }
}

// ---- etcd ----

EtcdCluster::~EtcdCluster() { stop(); }

void EtcdCluster::use_tls(std::string cert, std::string key, std::string ca, std::string client_ca,
                          std::string client_cert, std::string client_key) {
  tls_ = Tls{std::move(cert),      std::move(key),         std::move(ca),
             std::move(client_ca), std::move(client_cert), std::move(client_key)};
}

std::vector<std::string> EtcdCluster::etcdctl_tls() const {
  if (tls_.cert.empty()) return {};
  std::vector<std::string> out = {"--cacert=" + tls_.ca};
  if (!tls_.client_cert.empty()) {
    out.push_back("--cert=" + tls_.client_cert);
    out.push_back("--key=" + tls_.client_key);
  }
  return out;
}

std::string EtcdCluster::endpoint(int member) const {
  return "127.0.0.1:" + std::to_string(members_.at(static_cast<std::size_t>(member)).client_port);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

pid_t EtcdCluster::pid(int member) const {
  return members_.at(static_cast<std::size_t>(member)).pid;
}

Status EtcdCluster::start(int members, int election_ms, std::vector<std::string> extra) {
  dir_ = make_temp_dir("sluice-etcd");
  if (dir_.empty()) return Status(StatusCode::kInternal, "cannot create a temp dir for etcd");
  election_ms_ = election_ms;
  extra_ = std::move(extra);
  token_ = "sluice-test-" + std::to_string(::getpid()) + "-" + std::to_string(free_port());
  members_.clear();
  for (int i = 0; i < members; ++i) {
    Member m;
    m.name = std::string("m").append(std::to_string(i));
    m.client_port = free_port();
    m.peer_port = free_port();
    if (m.client_port == 0 || m.peer_port == 0 || m.client_port == m.peer_port)
      return Status(StatusCode::kInternal, "no free ports for etcd");
    if (i > 0) initial_cluster_ += ',';
    initial_cluster_ += m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
    members_.push_back(m);
  }
  // Every member first: a member of a larger cluster serves clients once a quorum is up.
  for (int i = 0; i < members; ++i)
    if (Status s = launch(i, true); !s.ok()) return s;
  for (int i = 0; i < members; ++i)
    if (Status s = wait_healthy(i, 20); !s.ok()) return s;
  return {};
}

Status EtcdCluster::launch(int member, bool fresh) {
  Member& m = members_.at(static_cast<std::size_t>(member));
  const std::string client = (tls_.cert.empty() ? "http://127.0.0.1:" : "https://127.0.0.1:") +
                             std::to_string(m.client_port);
  const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
  const std::vector<std::string> args = {"etcd",
                                         "--name",
                                         m.name,
                                         "--data-dir",
                                         dir_ + "/" + m.name,
                                         "--listen-client-urls",
                                         client,
                                         "--advertise-client-urls",
                                         client,
                                         "--listen-peer-urls",
                                         peer,
                                         "--initial-advertise-peer-urls",
                                         peer,
                                         "--initial-cluster",
                                         initial_cluster_,
                                         "--initial-cluster-state",
                                         fresh ? "new" : "existing",
                                         "--initial-cluster-token",
                                         token_,
                                         "--heartbeat-interval",
                                         std::to_string(std::max(10, election_ms_ / 10)),
                                         "--election-timeout",
                                         std::to_string(election_ms_),
                                         "--logger",
                                         "zap",
                                         "--log-outputs",
                                         "stderr"};
  std::vector<std::string> all = args;
  if (!tls_.cert.empty()) {
    all.insert(all.end(), {"--cert-file", tls_.cert, "--key-file", tls_.key});
    if (!tls_.client_ca.empty())
      all.insert(all.end(), {"--client-cert-auth", "--trusted-ca-file", tls_.client_ca});
  }
  all.insert(all.end(), extra_.begin(), extra_.end());
  m.pid = spawn(all, dir_ + "/" + m.name + ".log");
  if (m.pid < 0)
    return Status(StatusCode::kUnavailable, "cannot run etcd (etcd-server installed?)");
  start_guard(m.pid, SIGTERM, dir_);
  return {};
}

Status EtcdCluster::wait_healthy(int member, int seconds) {
  const Member& m = members_.at(static_cast<std::size_t>(member));
  const std::string log = dir_ + "/" + m.name + ".log";
  for (int i = 0; i < seconds * 10; ++i) {
    if (!alive(m.pid))
      return Status(StatusCode::kUnavailable, "etcd " + m.name + " exited: " + tail(log));
    std::vector<std::string> health = {"etcdctl", "--endpoints=" + endpoint(member),
                                       "--command-timeout=1s"};
    for (const std::string& a : etcdctl_tls()) health.push_back(a);
    health.insert(health.end(), {"endpoint", "health"});
    if (port_accepts(m.client_port) && run(health, dir_ + "/etcdctl.log") == 0) return {};
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status(StatusCode::kUnavailable,
                "etcd " + m.name + " did not become healthy: " + tail(log));
}

void EtcdCluster::kill(int member) {
  Member& m = members_.at(static_cast<std::size_t>(member));
  if (m.pid > 0) stop_pid(m.pid, SIGKILL);
  m.pid = -1;
}

Status EtcdCluster::restart(int member) {
  kill(member);
  if (Status s = launch(member, false); !s.ok()) return s;
  return wait_healthy(member, 20);
}

Status EtcdCluster::snapshot(const std::string& path) {
  for (int i = 0; i < size(); ++i) {
    if (run({"etcdctl", "--endpoints=" + endpoint(i), "snapshot", "save", path},
            dir_ + "/snapshot.log") == 0)
      return {};
  }
  return Status(StatusCode::kUnavailable,
                "etcdctl snapshot save failed: " + tail(dir_ + "/snapshot.log"));
}

Status EtcdCluster::restore(const std::string& path) {
  for (int i = 0; i < size(); ++i) kill(i);
  for (int i = 0; i < size(); ++i) {
    const Member& m = members_[static_cast<std::size_t>(i)];
    const std::string data = dir_ + "/" + m.name;
    std::error_code ec;
    fs::remove_all(data, ec);
    if (run({"etcdctl", "snapshot", "restore", path, "--name", m.name, "--data-dir", data,
             "--initial-cluster", initial_cluster_, "--initial-cluster-token", token_,
             "--initial-advertise-peer-urls", "http://127.0.0.1:" + std::to_string(m.peer_port)},
            dir_ + "/restore.log") != 0)
      return Status(StatusCode::kInternal,
                    "etcdctl snapshot restore failed: " + tail(dir_ + "/restore.log"));
  }
  for (int i = 0; i < size(); ++i)
    if (Status s = launch(i, true); !s.ok()) return s;
  for (int i = 0; i < size(); ++i)
    if (Status s = wait_healthy(i, 20); !s.ok()) return s;
  return {};
}

int EtcdCluster::etcdctl(const std::vector<std::string>& args, std::string* out) const {
  std::string eps;
  for (int i = 0; i < size(); ++i) {
    if (i > 0) eps += ',';
    eps += endpoint(i);
  }
  std::vector<std::string> full = {"etcdctl", "--endpoints=" + eps, "--command-timeout=2s"};
  for (const std::string& a : etcdctl_tls()) full.push_back(a);
  full.insert(full.end(), args.begin(), args.end());
  const std::string log = dir_ + "/etcdctl.out";
  std::error_code ec;
  fs::remove(log, ec);
  const int rc = run(full, log);
  if (out != nullptr) *out = tail(log, 1 << 20);
  return rc;
}

int EtcdCluster::leader() const {
  // "endpoint, id, version, db size, is leader, ..." per member that answers.
  std::string text;
  etcdctl({"endpoint", "status"}, &text);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> fields;
    std::istringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) {
      const auto b = cell.find_first_not_of(' ');
      fields.push_back(b == std::string::npos ? "" : cell.substr(b));
    }
    if (fields.size() < 5 || fields[4] != "true") continue;
    for (int i = 0; i < size(); ++i)
      if (fields[0] == endpoint(i)) return i;
  }
  return -1;
}

void EtcdCluster::stop() {
  for (Member& m : members_) {
    if (m.pid > 0) stop_pid(m.pid, SIGTERM);
    m.pid = -1;
  }
  members_.clear();
  initial_cluster_.clear();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    dir_.clear();
  }
}

}  // namespace sluice::testing
