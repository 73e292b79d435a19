// state_space.h: the breadth-first search the exhaustive model tests share (the gateway's queue,
// the fleet guard, federation's escrow, federation's regional pool).
//
// What it is: every state reached is stored once, in the order it was first reached, with the
// state it came from, the action that led to it and who took the action; so the entries are
// also the BFS queue, and a violation comes with the shortest trace that reaches it.
//
// A State is a plain struct compared and hashed as bytes: it must have unique object
// representations (no padding; zero it with memset before filling it in).
//
// Use:
//   StateSpace<State> space(kMaxStates);
//   space.add(init);
//   for (std::size_t at = 0; at < space.size(); ++at) {
//     const State s = space[at].state;
//     ...check the invariants; on a violation: space.trace(at, line)...
//     for each actor i and action a: State n = s; if (step(n, i, a)) space.add(n, at, a, i);
//   }
//   if (space.full()) ...the search stopped at kMaxStates...
//
// The visited set is an open-addressing table of (hash tag << 32 | index + 1) into the
// entries; the tag spares most mismatching probes a visit to the entries. A state added waits
// among the last kAhead added (its table slot fetched into the cache meanwhile) before it is
// looked up and stored, in the order added: size() and full() store the waiting ones first, so
// the BFS above sees every state it added.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace sluice::model {

// A 64-bit hash of a state's bytes.
template <class State>
std::uint64_t hash_bytes(const State& s) {
  static_assert(std::has_unique_object_representations_v<State>);
  std::array<std::uint64_t, (sizeof(State) + 7) / 8> words{};
  std::memcpy(words.data(), &s, sizeof(State));
  std::uint64_t h = 0x9E37'79B9'7F4A'7C15ull;
  for (std::uint64_t w : words) {
    h = (h ^ w) * 0xBF58'476D'1CE4'E5B9ull;
    h ^= h >> 29;
  }
  h *= 0x94D0'49BB'1331'11EBull;
  return h ^ (h >> 32);
}

template <class State>
class StateSpace {
 public:
  struct Entry {
    State state;
    std::uint32_t parent;  // the index of the state it came from (0 for the initial state)
    std::uint8_t action;
    std::uint8_t actor;  // who took the action: a node, a region, a pool
  };

  explicit StateSpace(std::size_t max_states = std::numeric_limits<std::uint32_t>::max())
      : max_states_(std::min<std::size_t>(max_states, std::numeric_limits<std::uint32_t>::max())) {}

  // Stores `s` unless it was reached before (once the kAhead states added after it are, or at
  // the next size() or full()). A new state past max_states is not stored, and full() says so
  // from then on.
  void add(const State& s, std::size_t parent = 0, std::uint8_t action = 0,
           std::uint8_t actor = 0) {
    if (waiting_ == kAhead) store_oldest();
    const std::uint64_t h = hash_bytes(s);
    if (!table_.empty()) __builtin_prefetch(&table_[h & (table_.size() - 1)]);
    ahead_[(first_ + waiting_) % kAhead] = {{s, static_cast<std::uint32_t>(parent), action, actor},
                                            h};
    ++waiting_;
  }

  [[nodiscard]] std::size_t size() {
    flush();
    return entries_.size();
  }
  [[nodiscard]] const Entry& operator[](std::size_t i) const noexcept { return entries_[i]; }
  // Whether some new state was not stored because the space held max_states already.
  [[nodiscard]] bool full() {
    flush();
    return full_;
  }
  [[nodiscard]] std::size_t max_states() const noexcept { return max_states_; }

  // The steps from the initial state to entries[at], one line each, numbered from 1:
  // "  N. " + line(entry) + "\n", where line says the action and the state it led to.
  template <class Line>
  [[nodiscard]] std::string trace(std::size_t at, Line line) const {
    std::vector<std::size_t> path;
    for (std::size_t k = at; k != 0; k = entries_[k].parent) path.push_back(k);
    std::string out;
    int step_no = 0;
    for (auto it = path.rbegin(); it != path.rend(); ++it)
      out += "  " + std::to_string(++step_no) + ". " + line(entries_[*it]) + "\n";
    return out;
  }

 private:
  static constexpr std::size_t kAhead = 8;
  struct Waiting {
    Entry entry;
    std::uint64_t hash;
  };

  void flush() {
    while (waiting_ > 0) store_oldest();
  }

  void store_oldest() {
    const Waiting& w = ahead_[first_];
    first_ = (first_ + 1) % kAhead;
    --waiting_;
    store(w.entry, w.hash);
  }

  void store(const Entry& e, std::uint64_t h) {
    if ((entries_.size() + 1) * 2 > table_.size()) grow();
    const std::size_t mask = table_.size() - 1;
    const State& s = e.state;
    const std::uint64_t tag = h >> 32;
    for (std::size_t slot = h & mask;; slot = (slot + 1) & mask) {
      const std::uint64_t held = table_[slot];
      if (held == 0) {
        if (entries_.size() >= max_states_) {
          full_ = true;
          return;
        }
        entries_.push_back(e);
        table_[slot] = tag << 32 | entries_.size();
        return;
      }
      if ((held >> 32) == tag &&
          std::memcmp(&entries_[(held & 0xFFFF'FFFFu) - 1].state, &s, sizeof(State)) == 0)
        return;
    }
  }

  void grow() {
    std::vector<std::uint64_t> table(std::max<std::size_t>(1024, table_.size() * 2), 0);
    const std::size_t mask = table.size() - 1;
    for (std::uint64_t held : table_) {
      if (held == 0) continue;
      std::size_t slot = hash_bytes(entries_[(held & 0xFFFF'FFFFu) - 1].state) & mask;
      while (table[slot] != 0) slot = (slot + 1) & mask;
      table[slot] = held;
    }
    table_.swap(table);
  }

  const std::size_t max_states_;
  std::vector<Entry> entries_;
  std::vector<std::uint64_t> table_;
  bool full_ = false;
  std::array<Waiting, kAhead> ahead_{};
  std::size_t first_ = 0;    // the oldest waiting state in ahead_
  std::size_t waiting_ = 0;  // states added and not stored yet
};

}  // namespace sluice::model
