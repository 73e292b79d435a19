// shared_rule_mirror.h: a server's copy of one scope of a coordinator's shared rules
// (sluice/backends/shared_rules.h), kept fresh by reading it every interval, and the writes to it.
//
// What it is: the rules a throttler set at run time live on the coordinator, so that every
// server naming it enforces them. The mirror holds the last copy read (what checks use: reading
// it costs no network), one thread of its own reads the scope every `interval` and writes the
// changes asked for, in order, each bounded by `timeout`: a transport thread never waits on the
// coordinator. Every entry the copy gains, loses or sees change (value, deadline) is handed to
// `changed` on that thread, in order, whether it came from this server's write or another's.
//
// Deadlines: the coordinator answers with the time left until each deadline on its own clock;
// the mirror turns it into this server's wall clock (unix milliseconds) when the answer
// arrives, so every server ends a rule at the same moment to within one call's latency and
// whatever their clocks say. A deadline that moved by less than kJitter is the same one (the
// answer's latency varies from read to read).
//
// Failures: a write that fails is answered with its error and changes nothing here; a read that
// fails keeps the last copy (rules are not dropped because the coordinator is away) and is
// counted; status() says how old the copy is and why the last read failed.
//
// Thread-safety: every member is safe to call concurrently. `changed` and every `done` run on
// the mirror's thread and must not wait for the mirror. The destructor stops the thread (after
// the write or read under way, whose `changed` it waits for); writes still queued are answered
// kUnavailable. It may run on the mirror's own thread (a `done` held the last reference to the
// mirror's owner): the thread then ends by itself, calling nothing more.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "server/completion.h"
#include "sluice/backends/shared_rules.h"
#include "sluice/core/status.h"

namespace sluice::server {

class SharedRuleMirror {
 public:
  static constexpr auto kJitter = std::chrono::milliseconds(50);

  struct Entry {
    std::string value;
    bool has_deadline = false;
    std::int64_t deadline_unix_ms = 0;  // this server's wall clock; 0 without a deadline
    bool drop_at_deadline = false;
    friend bool operator==(const Entry&, const Entry&) = default;
  };
  // An entry gained or changed (`now` non-null), or lost (null).
  using Changed = std::function<void(const std::string& key, const Entry* now)>;
  using Done = Once<void(Status)>;

  struct Health {
    std::uint64_t reads = 0;     // successful reads of the scope
    std::uint64_t failures = 0;  // failed reads
    std::optional<std::chrono::system_clock::time_point> last_read;  // the last good one
    std::string last_error;  // of the last read, empty when it succeeded
  };

  // Reads the scope once (waiting up to `timeout`; a failure is in health(), and the thread
  // tries again every interval), then starts the thread. `rules` must not be null.
  SharedRuleMirror(std::shared_ptr<SharedRules> rules, std::string scope, Nanos interval,
                   Nanos timeout, Changed changed);
  ~SharedRuleMirror();
  SharedRuleMirror(const SharedRuleMirror&) = delete;
  SharedRuleMirror& operator=(const SharedRuleMirror&) = delete;

  // The entry under `key` in the copy.
  [[nodiscard]] std::optional<Entry> get(const std::string& key) const;
  // How many entries of the copy have keys starting with `prefix`.
  [[nodiscard]] std::size_t count(const std::string& prefix) const;
  // Writes `entry` under `key` (`max_keys`: the scope's bound, sluice/backends/shared_rules.h);
  // `done` once the coordinator holds it and `changed` has seen it, or with the error.
  void put_async(const std::string& key, Entry entry, std::size_t max_keys, Done done);
  // Removes `key`; `done` as put_async().
  void erase_async(const std::string& key, Done done);

  [[nodiscard]] Health health() const;
  [[nodiscard]] std::string_view backend() const noexcept;

 private:
  struct Core;  // everything the thread uses: it holds it too (see the destructor)
  struct Write;
  static void enqueue(std::shared_ptr<Core> core, Write w);
  std::shared_ptr<Core> core_;
  std::thread thread_;
};

}  // namespace sluice::server
