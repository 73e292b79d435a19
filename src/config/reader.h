// reader.h: the YAML walker the config loader and every kind's parser share (through
// ConfigSection): typed reads that record every error with its line, column and field path,
// unknown-key checks, and the position of every field read, so that issues found later (the
// gateway's validation) can point at a line.
//
// Thread-safety: one Reader per load.
#pragma once

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/config/config.h"
#include "sluice/config/config_section.h"

namespace sluice::config_detail {

template <class E>
using Names = std::vector<std::pair<std::string_view, E>>;

// Walks the YAML tree, collecting every error with its position, and remembers each field's
// position by path so that issues found later (the gateway's validation) can point at a line.
class Reader {
 public:
  std::vector<ConfigError> errors;
  std::vector<ConfigError> warnings;
  std::map<std::string, YAML::Mark> marks;

  void error(const YAML::Node& n, const std::string& path, std::string message) {
    errors.push_back(make(n.IsDefined() ? n.Mark() : YAML::Mark::null_mark(), path, message));
  }
  void error_at(const YAML::Mark& m, const std::string& path, std::string message) {
    errors.push_back(make(m, path, std::move(message)));
  }

  static ConfigError make(const YAML::Mark& m, const std::string& path, std::string message) {
    ConfigError e;
    e.path = path;
    if (m.line >= 0) {
      e.line = m.line + 1;
      e.column = m.column + 1;
    }
    e.message = std::move(message);
    return e;
  }

  // A mapping (or absent: false without an error when optional). Its keys are checked for
  // repeats (unique_keys).
  bool map(const YAML::Node& n, const std::string& path, bool required = false) {
    if (!n.IsDefined() || n.IsNull()) {
      if (required) error(n, path, "is required");
      return false;
    }
    marks.emplace(path, n.Mark());
    if (!n.IsMap()) {
      error(n, path, "must be a mapping");
      return false;
    }
    unique_keys(n, path);
    return true;
  }

  // Every key of the mapping `n` at most once. The YAML library keeps a repeated key as a
  // second entry (and a lookup finds only one of them), so a repeat is an error at the repeat,
  // naming the first's line. Each mapping (by path) is checked once per load.
  void unique_keys(const YAML::Node& n, const std::string& path) {
    if (!unique_checked_.insert(path).second) return;
    std::map<std::string, YAML::Mark> first;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar()) continue;
      const auto [at, fresh] = first.emplace(it->first.Scalar(), it->first.Mark());
      if (fresh) continue;
      std::string message = "duplicate key (first at line ";
      message += std::to_string(at->second.line + 1);
      message += ')';
      error(it->first, join(path, it->first.Scalar()), std::move(message));
    }
  }

  bool sequence(const YAML::Node& n, const std::string& path) {
    if (!n.IsDefined() || n.IsNull()) return false;
    marks.emplace(path, n.Mark());
    if (!n.IsSequence()) {
      error(n, path, "must be a list");
      return false;
    }
    return true;
  }

  // Every key of `n` must be one of `allowed`.
  void keys(const YAML::Node& n, const std::string& path,
            const std::vector<std::string_view>& allowed) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar()) {
        error(it->first, path, "keys must be plain names");
        continue;
      }
      const std::string key = it->first.Scalar();
      bool known = false;
      for (std::string_view a : allowed) known = known || a == key;
      if (!known) {
        std::string list;
        for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        error(it->first, join(path, key), "unknown key (expected one of: " + list + ")");
      }
    }
  }

  static std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }

  std::optional<std::string> str(const YAML::Node& parent, std::string_view key,
                                 const std::string& path, bool required = false) {
    const YAML::Node n = parent[std::string(key)];
    const std::string p = join(path, key);
    if (!n.IsDefined() || n.IsNull()) {
      if (required) error(parent, p, "is required");
      return std::nullopt;
    }
    marks.emplace(p, n.Mark());
    if (!n.IsScalar()) {
      error(n, p, "must be a string");
      return std::nullopt;
    }
    return n.Scalar();
  }

  std::optional<std::uint64_t> uint(const YAML::Node& parent, std::string_view key,
                                    const std::string& path, std::uint64_t min, std::uint64_t max,
                                    bool required = false) {
    const std::optional<std::string> s = str(parent, key, path, required);
    if (!s) return std::nullopt;
    const YAML::Node n = parent[std::string(key)];
    // An optional minus sign, then digits: a whole number, in range or not.
    const bool negative = s->starts_with('-');
    const char* digits = s->data() + (negative ? 1 : 0);
    const char* last = s->data() + s->size();
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(digits, last, v);
    const bool too_big = ec == std::errc::result_out_of_range;
    if (end != last || end == digits || (ec != std::errc{} && !too_big)) {
      error(n, join(path, key), "must be a whole number, not '" + *s + "'");
      return std::nullopt;
    }
    if (too_big || (negative && v != 0) || v < min || v > max) {
      const bool below = negative ? (v != 0 || too_big) : (!too_big && v < min);
      error(n, join(path, key), range_message(min, max, below, *s));
      return std::nullopt;
    }
    return v;
  }

  // "must be >= 1, not -5" when the only bound that matters is the lower one (the upper is the
  // type's own), else "must be in [0, 999], not 1000".
  static std::string range_message(std::uint64_t min, std::uint64_t max, bool below,
                                   const std::string& was) {
    const bool type_max = max == std::numeric_limits<std::uint32_t>::max() ||
                          max == std::numeric_limits<std::uint64_t>::max();
    if (below && type_max) return "must be >= " + std::to_string(min) + ", not " + was;
    return "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], not " + was;
  }

  std::optional<std::uint32_t> u32(const YAML::Node& parent, std::string_view key,
                                   const std::string& path, std::uint32_t min = 0) {
    const auto v = uint(parent, key, path, min, std::numeric_limits<std::uint32_t>::max());
    return v ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(*v)) : std::nullopt;
  }

  std::optional<bool> boolean(const YAML::Node& parent, std::string_view key,
                              const std::string& path) {
    const std::optional<std::string> s = str(parent, key, path);
    if (!s) return std::nullopt;
    if (*s == "true") return true;
    if (*s == "false") return false;
    error(parent[std::string(key)], join(path, key), "must be true or false, not '" + *s + "'");
    return std::nullopt;
  }

  // Whether `text` is a duration in the right form (digits and a unit) that parse_duration()
  // refused only for its size.
  static bool too_long(std::string_view text) {
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    const std::string_view unit = text.substr(digits);
    return digits > 0 && (unit == "ns" || unit == "us" || unit == "ms" || unit == "s" ||
                          unit == "m" || unit == "h");
  }

  // A positive duration; with `zero_ok`, 0 ("0s") too.
  std::optional<Nanos> duration(const YAML::Node& parent, std::string_view key,
                                const std::string& path, bool zero_ok = false) {
    const std::optional<std::string> s = str(parent, key, path);
    if (!s) return std::nullopt;
    const std::optional<Nanos> d = parse_duration(*s);
    if (!d && too_long(*s)) {
      error(parent[std::string(key)], join(path, key),
            "is too long to hold: at most 2562047h (about 292 years), not '" + *s + "'");
      return std::nullopt;
    }
    if (!d || *d < Nanos{0} || (*d == Nanos{0} && !zero_ok)) {
      error(parent[std::string(key)], join(path, key),
            std::string(zero_ok ? "must be a duration such as 0s, 250ms or 2s"
                                : "must be a positive duration such as 250ms or 2s") +
                ", not '" + *s + "'");
      return std::nullopt;
    }
    return d;
  }

  template <class E>
  std::optional<E> choice(const YAML::Node& parent, std::string_view key, const std::string& path,
                          const Names<E>& names, bool required = false) {
    const std::optional<std::string> s = str(parent, key, path, required);
    if (!s) return std::nullopt;
    std::string list;
    for (const auto& [name, value] : names) {
      if (name == *s) return value;
      list += (list.empty() ? "" : ", ") + std::string(name);
    }
    error(parent[std::string(key)], join(path, key),
          "must be one of " + list + ", not '" + *s + "'");
    return std::nullopt;
  }

  // `n` (a mapping at `path`) as a section a kind reads.
  ConfigSection section(const YAML::Node& n, std::string path) {
    return ConfigSection(*this, std::make_shared<YAML::Node>(n), std::move(path));
  }

  // A gateway issue's path ("upstreams[2].concurrency_limit.per_tenant_max") under `base`, at
  // the position of the longest prefix of it that was read.
  YAML::Mark mark_of(const std::string& base, const std::string& path) const {
    std::string p = join(base, path);
    while (true) {
      if (auto it = marks.find(p); it != marks.end()) return it->second;
      const std::size_t cut = p.find_last_of(".[");
      if (cut == std::string::npos || cut == 0) return YAML::Mark::null_mark();
      p.resize(cut);
    }
  }

 private:
  std::set<std::string> unique_checked_;  // the mappings unique_keys has seen, by path
};

}  // namespace sluice::config_detail
