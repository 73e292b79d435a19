#include "server/shared_rule_mirror.h"

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice::server {
namespace {

// Whether two entries are the same rule: equal but for deadlines within kJitter of each other.
bool same(const SharedRuleMirror::Entry& a, const SharedRuleMirror::Entry& b) {
  return a.value == b.value && a.has_deadline == b.has_deadline &&
         a.drop_at_deadline == b.drop_at_deadline &&
         std::llabs(a.deadline_unix_ms - b.deadline_unix_ms) <
             std::chrono::milliseconds(SharedRuleMirror::kJitter).count();
}

}  // namespace

struct SharedRuleMirror::Write {
  std::string key;
  std::optional<Entry> entry;  // nullopt: erase
  std::size_t max_keys = 0;
  Done done;
};

struct SharedRuleMirror::Core {
  Core(std::shared_ptr<SharedRules> r, std::string s, Nanos i, Nanos t, Changed c)
      : rules(std::move(r)), scope(std::move(s)), interval(i), timeout(t), changed(std::move(c)) {}

  const std::shared_ptr<SharedRules> rules;
  const std::string scope;
  const Nanos interval;
  const Nanos timeout;
  const Changed changed;

  mutable std::mutex mu;
  std::map<std::string, Entry, std::less<>> copy;  // guarded by mu
  std::deque<Write> writes;                        // guarded by mu
  Health health;                                   // guarded by mu
  bool stopping = false;                           // guarded by mu
  std::condition_variable wake;
  // Held while `changed` runs, so that the destructor (on another thread) waits it out.
  std::mutex telling;

  void run() {
    auto next_read = std::chrono::steady_clock::now() + interval;
    std::unique_lock lock(mu);
    while (true) {
      wake.wait_until(lock, next_read, [&] { return stopping || !writes.empty(); });
      if (stopping) return;
      if (!writes.empty()) {
        Write w = std::move(writes.front());
        writes.pop_front();
        lock.unlock();
        write(std::move(w));
        lock.lock();
        continue;
      }
      lock.unlock();
      read();
      next_read = std::chrono::steady_clock::now() + interval;
      lock.lock();
    }
  }

  // One read of the scope, its changes handed to `changed`.
  void read() {
    const std::int64_t before = unix_ms_now();
    StatusOr<std::vector<SharedRule>> got = rules->list(scope, timeout);
    if (!got.ok()) {
      const std::lock_guard lock(mu);
      ++health.failures;
      health.last_error = got.status().message();
      return;
    }
    // The deadline as this server's clock read it halfway through the call.
    const std::int64_t at = before + (unix_ms_now() - before) / 2;
    std::map<std::string, Entry, std::less<>> next;
    for (SharedRule& r : got.value()) {
      Entry e;
      e.value = std::move(r.value);
      e.has_deadline = r.has_deadline;
      e.deadline_unix_ms =
          r.has_deadline ? at + std::chrono::ceil<std::chrono::milliseconds>(r.left).count() : 0;
      e.drop_at_deadline = r.drop_at_deadline;
      next.emplace(std::move(r.key), std::move(e));
    }
    std::vector<std::string> gone;
    {
      const std::lock_guard lock(mu);
      ++health.reads;
      health.last_read = std::chrono::system_clock::now();
      health.last_error.clear();
      for (const auto& [key, e] : copy)
        if (!next.contains(key)) gone.push_back(key);
    }
    for (const std::string& key : gone) settle(key, std::nullopt);
    for (auto& [key, e] : next) settle(key, std::move(e));
  }

  void write(Write w) {
    Status s;
    if (w.entry) {
      const Entry& e = *w.entry;
      const Nanos left = e.has_deadline
                             ? Nanos{std::chrono::milliseconds(e.deadline_unix_ms - unix_ms_now())}
                             : Nanos{0};
      s = rules->put(scope, w.key, e.value, e.has_deadline, left, e.drop_at_deadline, w.max_keys,
                     timeout);
    } else {
      s = rules->erase(scope, w.key, timeout);
    }
    if (s.ok()) settle(w.key, std::move(w.entry));
    // May end the mirror's owner, and so the mirror (on this thread): nothing of `this` but the
    // loop's check of `stopping` runs after it, and the Core outlives the mirror.
    w.done(std::move(s));
  }

  // Replaces the copy's entry under `key` (nullopt: removes it) and tells `changed` when it
  // changed, unless the mirror is stopping.
  void settle(const std::string& key, std::optional<Entry> entry) {
    const std::lock_guard tell(telling);
    {
      const std::lock_guard lock(mu);
      if (stopping) return;
      const auto it = copy.find(key);
      if (!entry) {
        if (it == copy.end()) return;
        copy.erase(it);
      } else {
        if (it != copy.end() && same(it->second, *entry)) return;
        copy.insert_or_assign(key, *entry);
      }
    }
    changed(key, entry ? &*entry : nullptr);
  }
};

SharedRuleMirror::SharedRuleMirror(std::shared_ptr<SharedRules> rules, std::string scope,
                                   Nanos interval, Nanos timeout, Changed changed)
    : core_(std::make_shared<Core>(std::move(rules), std::move(scope), interval, timeout,
                                   std::move(changed))) {
  core_->read();
  thread_ = std::thread([core = core_] { core->run(); });
}

SharedRuleMirror::~SharedRuleMirror() {
  std::deque<Write> left;
  {
    const std::lock_guard lock(core_->mu);
    core_->stopping = true;
    left.swap(core_->writes);
  }
  core_->wake.notify_all();
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // inside a `done`: the thread ends when it returns, holding the Core
  } else {
    // A `changed` under way finishes first (it may use what owns the mirror).
    { const std::lock_guard tell(core_->telling); }
    thread_.join();
  }
  for (Write& w : left)
    w.done(Status(StatusCode::kUnavailable,
                  "the throttler was replaced before the change was written; it was not made"));
}

std::optional<SharedRuleMirror::Entry> SharedRuleMirror::get(const std::string& key) const {
  const std::lock_guard lock(core_->mu);
  const auto it = core_->copy.find(key);
  if (it == core_->copy.end()) return std::nullopt;
  return it->second;
}

std::size_t SharedRuleMirror::count(const std::string& prefix) const {
  const std::lock_guard lock(core_->mu);
  std::size_t n = 0;
  for (auto it = core_->copy.lower_bound(prefix);
       it != core_->copy.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    ++n;
  return n;
}

void SharedRuleMirror::put_async(const std::string& key, Entry entry, std::size_t max_keys,
                                 Done done) {
  enqueue(core_, Write{key, std::move(entry), max_keys, std::move(done)});
}

void SharedRuleMirror::erase_async(const std::string& key, Done done) {
  enqueue(core_, Write{key, std::nullopt, 0, std::move(done)});
}

// Through a copy of the Core's pointer: once the write is queued, its `done` may end this
// mirror (on its thread) before the caller's thread returns from here.
void SharedRuleMirror::enqueue(std::shared_ptr<Core> core, Write w) {
  {
    const std::lock_guard lock(core->mu);
    core->writes.push_back(std::move(w));
  }
  core->wake.notify_all();
}

SharedRuleMirror::Health SharedRuleMirror::health() const {
  const std::lock_guard lock(core_->mu);
  return core_->health;
}

std::string_view SharedRuleMirror::backend() const noexcept { return core_->rules->backend(); }

}  // namespace sluice::server
