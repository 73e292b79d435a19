// runtime_state.h: rules set at run time (through admin endpoints) that survive a restart.
//
// What it is: RuntimeStateStore holds JSON values by (scope, key), where a scope is usually a
// policy's name and a key one of its rules (a throttler's per-app throttle rule), and keeps
// them in one file. RuntimeState is the handle a policy is given: the store, fixed to its own
// scope.
//
// The file: one JSON object, {"version": 1, "scopes": {scope: {key: value}}}, mode 0600. Every
// put and erase that changes something writes the whole document before it returns: to a temp
// file beside the path (mkstemp, so 0600 from creation), fsync, rename over the path, fsync the
// directory. A crash at any point leaves either the old file or the new one, never a mix (at
// worst a stray temp file, <path>.XXXXXX, beside it).
// open() reads it back; a file that is not what the store writes (not JSON, another version,
// a field it does not know, a value out of bounds) is an error naming the path and what is
// wrong, never an empty store, so a user's rules are never dropped silently. A missing file is
// an empty store. An empty path keeps everything in memory only.
//
// Bounds (checked on every call and on load; an error names the field): a scope and a key are
// 1 to 256 bytes of UTF-8; a value serializes to at most 64 KiB and reads back as itself (no
// NaN, infinity or binary); a scope holds at most 10,000 keys. A scope with no keys is dropped.
//
// Errors: INVALID_ARGUMENT for a bad scope, key or value and for a file that is not the store's;
// FAILED_PRECONDITION for a put that would take a full scope past its key bound; for I/O,
// PERMISSION_DENIED (EACCES, EPERM, EROFS) or UNAVAILABLE (anything else: a full disk, an I/O
// error), with the path, the step and the errno text.
//
// Invariants: memory holds exactly what the last successful write put in the file (or what
// open() read). A put or erase that returns an error changed nothing in memory; if it failed
// after the rename (the directory's fsync), the file may hold the change until the next write,
// which rewrites it from memory. One store per file: two processes writing one path each
// overwrite the other's changes.
//
// Thread-safety: every member of both classes is safe to call concurrently. The store holds one
// mutex across each whole call, the file write included, so writes are serialized and a reader
// never sees a change before it is durable. A reader waits out a write's fsync, so the store is
// for admin calls and start-up, not for each admitted call.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "server/completion.h"
#include "sluice/core/status.h"

namespace sluice::server {

class RuntimeStateStore {
 public:
  static constexpr int kVersion = 1;
  static constexpr std::size_t kMaxScopeBytes = 256;
  static constexpr std::size_t kMaxKeyBytes = 256;
  static constexpr std::size_t kMaxValueBytes = 64 * 1024;  // serialized
  static constexpr std::size_t kMaxKeysPerScope = 10'000;

  // The store kept in `path` (empty: memory only). A missing file is an empty store (its
  // directory must exist); an unreadable or malformed one is an error naming the path, and so
  // is a file another store holds (another server: "<path>.lock" is locked while one lives).
  [[nodiscard]] static StatusOr<std::unique_ptr<RuntimeStateStore>> open(std::string path);

  RuntimeStateStore(const RuntimeStateStore&) = delete;
  RuntimeStateStore& operator=(const RuntimeStateStore&) = delete;
  ~RuntimeStateStore();

  // The value under (scope, key); nullopt when there is none; an error for a bad scope or key.
  [[nodiscard]] StatusOr<std::optional<nlohmann::json>> get(std::string_view scope,
                                                            std::string_view key) const;
  // Sets (scope, key) to `value`, durably: waits for the write that holds it.
  [[nodiscard]] Status put(std::string_view scope, std::string_view key, nlohmann::json value);
  // Removes (scope, key), durably. Ok, and nothing written, when it is not there.
  [[nodiscard]] Status erase(std::string_view scope, std::string_view key);

  // The same without waiting (a transport thread must not wait on a disk): the change is seen
  // by get() and list() at once, and `done` is called with the outcome of the write that holds
  // it, on the store's writer thread, or at once for bad input, a change that changes nothing
  // or a store without a file. Changes made while a write is under way share the next one, so
  // a burst costs a write or two, not one each. A failed write takes back every change not yet
  // written, answering each with the error. `done` must not wait for the store.
  using Done = Once<void(Status)>;
  void put_async(std::string_view scope, std::string_view key, nlohmann::json value, Done done);
  void erase_async(std::string_view scope, std::string_view key, Done done);
  // Writes of the file so far.
  [[nodiscard]] std::uint64_t writes() const;
  // Every key of `scope` and its value (empty for a scope with none, or a bad scope).
  [[nodiscard]] std::map<std::string, nlohmann::json> list(std::string_view scope) const;
  // How many keys `scope` holds.
  [[nodiscard]] std::size_t size(std::string_view scope) const;
  // Removes every key of `scope`, durably. Ok, and nothing written, when it has none.
  [[nodiscard]] Status erase_scope(std::string_view scope);

  // The file (empty: memory only).
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  using Scope = std::map<std::string, nlohmann::json, std::less<>>;
  using Scopes = std::map<std::string, Scope, std::less<>>;

  RuntimeStateStore(std::string path, Scopes scopes, int lock_fd)
      : path_(std::move(path)), lock_fd_(lock_fd), scopes_(scopes), written_(std::move(scopes)) {}

  // A change to scopes_ (under mu_): an error leaves them as they were; `changed` false: they
  // already were so.
  using Change = std::function<Status(Scopes& scopes, bool& changed)>;
  // Applies `change` and answers `done` as put_async() says.
  void change_async(Change change, Done done);
  // Waits for change_async()'s answer.
  Status change_sync(Change change);
  void writer_loop();

  const std::string path_;
  const int lock_fd_;  // flock()ed "<path_>.lock" (-1: memory only)
  mutable std::mutex mu_;
  Scopes scopes_;                 // guarded by mu_; no empty scope; what readers see
  Scopes written_;                // guarded by mu_: what the file holds
  std::vector<Done> waiting_;     // guarded by mu_: changes in scopes_ not yet written
  std::uint64_t writes_ = 0;      // guarded by mu_
  bool stopping_ = false;         // guarded by mu_
  std::condition_variable wake_;  // the writer: waiting_ or stopping_
  std::thread writer_;            // started by the first change to a store with a file
};

// One scope of a store: what a policy is given for its own name. Holds the store by shared_ptr
// because the store outlives any one policy (a reload replaces policies; the store stays).
class RuntimeState {
 public:
  // Precondition: store is not null.
  RuntimeState(std::shared_ptr<RuntimeStateStore> store, std::string scope)
      : store_(std::move(store)), scope_(std::move(scope)) {}

  [[nodiscard]] StatusOr<std::optional<nlohmann::json>> get(std::string_view key) const {
    return store_->get(scope_, key);
  }
  [[nodiscard]] Status put(std::string_view key, nlohmann::json value) {
    return store_->put(scope_, key, std::move(value));
  }
  [[nodiscard]] Status erase(std::string_view key) { return store_->erase(scope_, key); }
  void put_async(std::string_view key, nlohmann::json value, RuntimeStateStore::Done done) {
    store_->put_async(scope_, key, std::move(value), std::move(done));
  }
  void erase_async(std::string_view key, RuntimeStateStore::Done done) {
    store_->erase_async(scope_, key, std::move(done));
  }
  [[nodiscard]] std::map<std::string, nlohmann::json> list() const { return store_->list(scope_); }
  [[nodiscard]] std::size_t size() const { return store_->size(scope_); }

  [[nodiscard]] const std::string& scope() const noexcept { return scope_; }
  [[nodiscard]] const std::shared_ptr<RuntimeStateStore>& store() const noexcept { return store_; }

 private:
  std::shared_ptr<RuntimeStateStore> store_;
  std::string scope_;
};

}  // namespace sluice::server
