// state_space.h: the breadth-first search the exhaustive model tests share (the fleet guard,
// federation's escrow, federation's regional pool).
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
// entries; the tag spares most mismatching probes a visit to the entries.
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

  // Stores `s` unless it was reached before. A new state past max_states is not stored, and
  // full() says so from then on.
  void add(const State& s, std::size_t parent = 0, std::uint8_t action = 0,
           std::uint8_t actor = 0) {
    if ((entries_.size() + 1) * 2 > table_.size()) grow();
    const std::size_t mask = table_.size() - 1;
    const std::uint64_t h = hash_bytes(s);
    const std::uint64_t tag = h >> 32;
    for (std::size_t slot = h & mask;; slot = (slot + 1) & mask) {
      const std::uint64_t held = table_[slot];
      if (held == 0) {
        if (entries_.size() >= max_states_) {
          full_ = true;
          return;
        }
        entries_.push_back({s, static_cast<std::uint32_t>(parent), action, actor});
        table_[slot] = tag << 32 | entries_.size();
        return;
      }
      if ((held >> 32) == tag &&
          std::memcmp(&entries_[(held & 0xFFFF'FFFFu) - 1].state, &s, sizeof(State)) == 0)
        return;
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] const Entry& operator[](std::size_t i) const noexcept { return entries_[i]; }
  // Whether some new state was not stored because the space held max_states already.
  [[nodiscard]] bool full() const noexcept { return full_; }
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
};

}  // namespace sluice::model
