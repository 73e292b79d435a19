// config_section.h: one mapping of the config file as a policy kind reads it.
//
// What it is: each policy kind parses its own section of the file (`policies.<name>`) through a
// ConfigSection: typed reads of its keys, nested mappings and lists, and errors that carry the
// field's path and its line and column in the file. A kind never sees the YAML library. Every
// read records where the field was, so an error found later (a validation over the whole
// section) can point at the deepest field of its path that was read (error_at).
//
// Reads never throw: a malformed value is an error (recorded, the read gives nullopt) and the
// load goes on, so one pass reports every problem.
//
// Thread-safety: a section belongs to one load, on one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/algorithm_spec.h"
#include "sluice/core/clock.h"

namespace sluice {

namespace config_detail {
class Reader;
}

class ConfigSection {
 public:
  // Its path in the file ("policies.api", "policies.gw.upstreams[0]").
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] bool has(std::string_view key) const;

  // Every key of the section must be one of `allowed`: any other is an error at that key.
  void keys(std::initializer_list<std::string_view> allowed);
  void keys(const std::vector<std::string_view>& allowed);

  // A scalar, as text.
  std::optional<std::string> str(std::string_view key, bool required = false);
  // A whole number in [min, max].
  std::optional<std::uint64_t> uint(std::string_view key, std::uint64_t min, std::uint64_t max,
                                    bool required = false);
  std::optional<std::uint32_t> u32(std::string_view key, std::uint32_t min = 0);
  std::optional<bool> boolean(std::string_view key);
  // A finite decimal number ("5", "0.25", "1e3").
  std::optional<double> number(std::string_view key, bool required = false);
  // A list of scalars; nullopt when absent, or not a list of scalars (an error).
  std::optional<std::vector<std::string>> strings(std::string_view key);
  // A mapping of names to numbers (`thresholds: {lag: 2, load: 8}`), in the file's order; an
  // entry that is not a number is an error at it (and left out).
  std::optional<std::vector<std::pair<std::string, double>>> numbers(std::string_view key);
  // A positive duration: an integer and a unit (ns, us, ms, s, m, h).
  std::optional<Nanos> duration(std::string_view key);
  // A duration that may be 0 ("0s"): for a field whose 0 has a meaning of its own.
  std::optional<Nanos> duration_or_zero(std::string_view key);
  // One of `words`, as written; an error lists them.
  std::optional<std::string> one_of(std::string_view key,
                                    const std::vector<std::string_view>& words,
                                    bool required = false);
  // One of `names`; an error lists them.
  template <class E>
  std::optional<E> choice(std::string_view key,
                          std::initializer_list<std::pair<std::string_view, E>> names,
                          bool required = false) {
    std::vector<std::string_view> words;
    for (const auto& n : names) words.push_back(n.first);
    const std::optional<std::size_t> i = choose(key, words, required);
    if (!i) return std::nullopt;
    return (names.begin() + *i)->second;
  }

  // A nested mapping; nullopt when absent (an error when required) or not a mapping (an error).
  std::optional<ConfigSection> map(std::string_view key, bool required = false);
  // A list of mappings: `each(section)` for every entry ("<key>[<i>]"); a non-list is an error.
  void each(std::string_view key, const std::function<void(ConfigSection&)>& each);
  // A mapping of named mappings (`metrics: {lag: {...}, load: {...}}`): `each(name, section)`
  // for every entry, in the file's order ("<key>.<name>"); an entry that is not a mapping is
  // an error, and so is a `key` that is not a mapping.
  void named(std::string_view key,
             const std::function<void(const std::string& name, ConfigSection&)>& each);

  // An error at `key` (or at the section when it has no such key), path "<path>.<key>".
  void error(std::string_view key, const std::string& message);
  // An error at the section itself.
  void error(const std::string& message);
  // An error or a warning at the path `relative` below this section (e.g. "upstreams[2].owner"),
  // placed at the deepest part of that path that was read.
  void error_at(const std::string& relative, const std::string& message);
  // How many errors the load holds so far (every section's): a check over what was read
  // runs only when the reads before it went well.
  [[nodiscard]] std::size_t error_count() const noexcept;
  void warning_at(const std::string& relative, const std::string& message);

 private:
  friend class config_detail::Reader;
  ConfigSection(config_detail::Reader& reader, std::shared_ptr<const void> node, std::string path)
      : reader_(&reader), node_(std::move(node)), path_(std::move(path)) {}
  std::optional<std::size_t> choose(std::string_view key,
                                    const std::vector<std::string_view>& words, bool required);

  config_detail::Reader* reader_;
  std::shared_ptr<const void> node_;  // the YAML node
  std::string path_;
};

// A limit algorithm's fields (algorithm, limit, initial_limit, min_limit, max_limit), checked by
// the algorithm's own rules with its defaults filling in the rest. Adaptive and fleet policies
// share them.
void read_algorithm(ConfigSection& section, AlgorithmSpec& out);

}  // namespace sluice
