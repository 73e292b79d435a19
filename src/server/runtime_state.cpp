#include "server/runtime_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <system_error>

#include "server/calls.h"
#include "sluice/core/text.h"

namespace sluice::server {
namespace {

using nlohmann::json;

// The file's I/O: each failure is a Status naming the path, the step and the errno text.

// A file the server cannot read or write is the server's trouble, never the caller's (a 503
// with the path and the error, not a 403 the caller would take for its own credentials).
Status io_error(const std::string& path, std::string_view step, int err) {
  const StatusCode code = StatusCode::kUnavailable;
  std::string message = path + ": " + std::string(step) + ": ";
  message += std::error_code(err, std::generic_category()).message();
  return Status(code, std::move(message));
}

std::string directory_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

Status write_all(int fd, std::string_view bytes, const std::string& tmp) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error(tmp, "write", errno);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  if (::fchmod(fd, 0600) != 0) return io_error(tmp, "chmod 0600", errno);
  if (::fsync(fd) != 0) return io_error(tmp, "fsync", errno);
  return {};
}

Status sync_directory(const std::string& dir, const std::string& path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error(path, "open directory " + dir + " to fsync it", errno);
  Status s;
  if (::fsync(fd) != 0) s = io_error(path, "fsync directory " + dir, errno);
  ::close(fd);
  return s;
}

// Replaces `path` by `bytes`: temp file, fsync, rename, fsync the directory.
Status write_durably(const std::string& path, std::string_view bytes) {
  const std::string dir = directory_of(path);
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return io_error(path, "create a temp file in " + dir, errno);
  Status s = write_all(fd, bytes, tmp);
  if (::close(fd) != 0 && s.ok()) s = io_error(tmp, "close", errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = io_error(path, "rename " + tmp + " over it", errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return sync_directory(dir, path);
}

// The file's bytes; nullopt when there is no file (and its directory exists).
StatusOr<std::optional<std::string>> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno != ENOENT) return io_error(path, "open", errno);
  if (fd < 0) {
    struct stat st {};
    const std::string dir = directory_of(path);
    if (::stat(dir.c_str(), &st) != 0) return io_error(path, "stat directory " + dir, errno);
    if (!S_ISDIR(st.st_mode)) return invalid(path, dir + " is not a directory");
    return std::optional<std::string>();
  }
  struct stat st {};
  std::string text;
  Status s;
  if (::fstat(fd, &st) != 0) {
    s = io_error(path, "stat", errno);
  } else if (!S_ISREG(st.st_mode)) {
    s = invalid(path, "is not a regular file");
  }
  char buf[1 << 16];
  while (s.ok()) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) s = io_error(path, "read", errno);
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (!s.ok()) return s;
  return std::optional<std::string>(std::move(text));
}

// Bounds, shared by the calls and the loader.

Status check_name(std::string_view field, std::string_view name, std::size_t max) {
  if (name.empty()) return invalid(field, "is empty");
  if (name.size() > max) {
    return invalid(field,
                   "is " + std::to_string(name.size()) + " bytes; at most " + std::to_string(max));
  }
  if (!is_utf8(name)) return invalid(field, "is not valid UTF-8");
  return {};
}

Status check_names(std::string_view scope, std::string_view key) {
  if (Status s = check_name("scope", scope, RuntimeStateStore::kMaxScopeBytes); !s.ok()) return s;
  return check_name("key", key, RuntimeStateStore::kMaxKeyBytes);
}

Status check_value(const json& value) {
  if (value.is_discarded()) return invalid("value", "is not a JSON value");
  std::string text;
  try {
    text = value.dump();
  } catch (const json::type_error&) {
    return invalid("value", "holds a string that is not valid UTF-8");
  }
  if (text.size() > RuntimeStateStore::kMaxValueBytes) {
    return invalid("value", "serializes to " + std::to_string(text.size()) + " bytes; at most " +
                                std::to_string(RuntimeStateStore::kMaxValueBytes));
  }
  if (json::parse(text, nullptr, false) != value) {
    return invalid("value", "does not read back as itself (NaN, infinity or binary data)");
  }
  return {};
}

Status too_many_keys(std::size_t n) {
  return Status(StatusCode::kFailedPrecondition,
                "scope: holds " + std::to_string(n) + " keys; at most " +
                    std::to_string(RuntimeStateStore::kMaxKeysPerScope));
}

}  // namespace

// The file format, both ways.
namespace {

// RuntimeStateStore's (private) Scope and Scopes.
using Scope = std::map<std::string, json, std::less<>>;
using Scopes = std::map<std::string, Scope, std::less<>>;

std::string render(const Scopes& scopes) {
  json doc = {{"version", RuntimeStateStore::kVersion}, {"scopes", json::object()}};
  for (const auto& [name, keys] : scopes) {
    json& out = doc["scopes"][name];
    for (const auto& [key, value] : keys) out[key] = value;
  }
  return doc.dump(2) + "\n";
}

// `what` about the file at `path`.
Status not_ours(const std::string& path, std::string_view what) {
  return invalid(path, std::string(what) + " (not a runtime-state file this build reads)");
}

StatusOr<Scope> parse_scope(const std::string& path, const std::string& name, const json& keys) {
  const std::string where = "scopes[" + json(name).dump() + "]";
  if (Status s = check_name("scope", name, RuntimeStateStore::kMaxScopeBytes); !s.ok()) {
    return not_ours(path, where + ": " + s.message());
  }
  if (!keys.is_object()) return not_ours(path, where + ": is not an object");
  if (keys.size() > RuntimeStateStore::kMaxKeysPerScope) {
    return not_ours(path, where + ": " + too_many_keys(keys.size()).message());
  }
  Scope scope;
  for (const auto& [key, value] : keys.items()) {
    Status s = check_name("key", key, RuntimeStateStore::kMaxKeyBytes);
    if (s.ok()) s = check_value(value);
    if (!s.ok()) return not_ours(path, where + "[" + json(key).dump() + "]: " + s.message());
    scope.emplace(key, value);
  }
  return scope;
}

StatusOr<Scopes> parse_document(const std::string& path, const std::string& text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    return not_ours(path, std::string("is not JSON: ") + e.what());
  }
  if (!doc.is_object()) return not_ours(path, "is not a JSON object");
  for (const auto& [field, unused] : doc.items()) {
    if (field != "version" && field != "scopes") {
      return not_ours(path, "has an unknown field " + json(field).dump());
    }
  }
  if (!doc.contains("version")) return not_ours(path, "has no \"version\"");
  const json& version = doc["version"];
  if (!version.is_number_integer() || version.get<std::int64_t>() != RuntimeStateStore::kVersion) {
    return not_ours(path, "is version " + version.dump() + "; this build reads version " +
                              std::to_string(RuntimeStateStore::kVersion));
  }
  if (!doc.contains("scopes") || !doc["scopes"].is_object()) {
    return not_ours(path, "has no \"scopes\" object");
  }
  Scopes scopes;
  for (const auto& [name, keys] : doc["scopes"].items()) {
    auto scope = parse_scope(path, name, keys);
    if (!scope.ok()) return scope.status();
    if (!scope.value().empty()) scopes.emplace(name, std::move(scope.value()));
  }
  return scopes;
}

}  // namespace

StatusOr<std::unique_ptr<RuntimeStateStore>> RuntimeStateStore::open(std::string path) {
  Scopes scopes;
  int lock_fd = -1;
  if (!path.empty()) {
    auto text = read_file(path);
    if (!text.ok()) return text.status();
    if (text.value().has_value()) {
      auto parsed = parse_document(path, *text.value());
      if (!parsed.ok()) return parsed.status();
      scopes = std::move(parsed.value());
    }
    // One server per file: two would each rewrite it from their own rules and lose the
    // other's. The lock is on a file beside it (the state file itself is replaced by rename),
    // held while the store lives; the kernel drops it when the process ends, however it ends.
    const std::string lock_path = path + ".lock";
    lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0) return io_error(path, "open its lock file " + lock_path, errno);
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(lock_fd);
      if (err == EWOULDBLOCK)
        return Status(StatusCode::kFailedPrecondition,
                      path + ": in use by another sluice server (it holds " + lock_path +
                          "); give each server a state file of its own");
      return io_error(path, "lock " + lock_path, err);
    }
  }
  return std::unique_ptr<RuntimeStateStore>(
      new RuntimeStateStore(std::move(path), std::move(scopes), lock_fd));
}

RuntimeStateStore::~RuntimeStateStore() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;  // the writer answers what waits, then ends
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void RuntimeStateStore::change_async(Change change, Done done) {
  std::unique_lock<std::mutex> lock(mu_);
  bool changed = true;
  if (Status s = change(scopes_, changed); !s.ok()) {
    lock.unlock();
    return done(std::move(s));
  }
  // Nothing to write: a store without a file, or a change that changes nothing while the file
  // holds what readers see.
  if (path_.empty() || (!changed && waiting_.empty())) {
    lock.unlock();
    return done(Status{});
  }
  waiting_.push_back(std::move(done));
  if (!writer_.joinable()) writer_ = std::thread([this] { writer_loop(); });
  lock.unlock();
  wake_.notify_one();
}

Status RuntimeStateStore::change_sync(Change change) {
  OneShot<Status> answer;
  change_async(std::move(change), answer.setter());
  return answer.get();
}

void RuntimeStateStore::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
    if (waiting_.empty()) return;  // stopping, nothing left to answer
    // One write for every change made so far; later ones wait for the next.
    std::vector<Done> batch = std::move(waiting_);
    waiting_.clear();
    Scopes snapshot = scopes_;
    lock.unlock();
    Status s;
    std::string bytes;
    try {
      bytes = render(snapshot);
    } catch (const std::exception& e) {  // out of memory: the bounds leave nothing else to throw
      s = Status(StatusCode::kUnavailable, path_ + ": render: " + e.what());
    }
    if (s.ok()) s = write_durably(path_, bytes);
    lock.lock();
    if (s.ok()) {
      written_ = std::move(snapshot);
      ++writes_;
    } else {
      // Not written: what readers see goes back to what the file holds, and every change
      // since (those of this write and those waiting for the next) is answered with why.
      scopes_ = written_;
      for (Done& d : waiting_) batch.push_back(std::move(d));
      waiting_.clear();
    }
    lock.unlock();
    for (Done& d : batch) d(s);
    lock.lock();
  }
}

std::uint64_t RuntimeStateStore::writes() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

std::size_t RuntimeStateStore::size(std::string_view scope) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto sc = scopes_.find(scope);
  return sc == scopes_.end() ? 0 : sc->second.size();
}

StatusOr<std::optional<json>> RuntimeStateStore::get(std::string_view scope,
                                                     std::string_view key) const {
  if (Status s = check_names(scope, key); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  const auto sc = scopes_.find(scope);
  if (sc == scopes_.end()) return std::optional<json>();
  const auto it = sc->second.find(key);
  if (it == sc->second.end()) return std::optional<json>();
  return std::optional<json>(it->second);
}

namespace {

// The change that sets (scope, key) to `value` (checked by the caller).
auto set_to(std::string_view scope, std::string_view key, json value) {
  return [scope = std::string(scope), key = std::string(key), value = std::move(value)](
             auto& scopes, bool& changed) mutable -> Status {
    const auto [sc, new_scope] = scopes.try_emplace(scope);
    auto& keys = sc->second;
    const auto it = keys.find(key);
    if (it != keys.end() && it->second == value) {
      changed = false;  // already so
      return {};
    }
    if (it == keys.end() && keys.size() >= RuntimeStateStore::kMaxKeysPerScope) {
      const Status s = too_many_keys(keys.size());
      if (new_scope) scopes.erase(sc);
      return s;
    }
    keys.insert_or_assign(key, std::move(value));
    return {};
  };
}

// The change that removes (scope, key); the scope's last key takes the scope with it.
auto erased(std::string_view scope, std::string_view key) {
  return
      [scope = std::string(scope), key = std::string(key)](auto& scopes, bool& changed) -> Status {
        const auto sc = scopes.find(scope);
        if (sc == scopes.end() || sc->second.erase(key) == 0) {
          changed = false;
          return {};
        }
        if (sc->second.empty()) scopes.erase(sc);
        return {};
      };
}

}  // namespace

Status RuntimeStateStore::put(std::string_view scope, std::string_view key, json value) {
  if (Status s = check_names(scope, key); !s.ok()) return s;
  if (Status s = check_value(value); !s.ok()) return s;
  return change_sync(set_to(scope, key, std::move(value)));
}

void RuntimeStateStore::put_async(std::string_view scope, std::string_view key, json value,
                                  Done done) {
  if (Status s = check_names(scope, key); !s.ok()) return done(std::move(s));
  if (Status s = check_value(value); !s.ok()) return done(std::move(s));
  change_async(set_to(scope, key, std::move(value)), std::move(done));
}

Status RuntimeStateStore::erase(std::string_view scope, std::string_view key) {
  if (Status s = check_names(scope, key); !s.ok()) return s;
  return change_sync(erased(scope, key));
}

void RuntimeStateStore::erase_async(std::string_view scope, std::string_view key, Done done) {
  if (Status s = check_names(scope, key); !s.ok()) return done(std::move(s));
  change_async(erased(scope, key), std::move(done));
}

std::map<std::string, json> RuntimeStateStore::list(std::string_view scope) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto sc = scopes_.find(scope);
  if (sc == scopes_.end()) return {};
  return {sc->second.begin(), sc->second.end()};
}

Status RuntimeStateStore::erase_scope(std::string_view scope) {
  if (Status s = check_name("scope", scope, kMaxScopeBytes); !s.ok()) return s;
  return change_sync([scope = std::string(scope)](Scopes& scopes, bool& changed) -> Status {
    changed = scopes.erase(scope) > 0;
    return {};
  });
}

}  // namespace sluice::server
