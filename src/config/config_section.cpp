#include "sluice/config/config_section.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "config/reader.h"
#include "sluice/core/aimd_limit.h"
#include "sluice/core/gradient2_limit.h"
#include "sluice/core/vegas_limit.h"

namespace sluice {
namespace {

const YAML::Node& node(const std::shared_ptr<const void>& p) {
  return *static_cast<const YAML::Node*>(p.get());
}

// An adaptive algorithm's default for one of its limits (its options' own), if `field` is one.
template <class Options>
std::optional<std::uint32_t> default_limit(std::string_view field) {
  const Options o;
  if (field == "initial_limit") return o.initial_limit;
  if (field == "min_limit") return o.min_limit;
  if (field == "max_limit") return o.max_limit;
  return std::nullopt;
}

std::optional<std::uint32_t> default_limit(AlgorithmSpec::Kind kind, std::string_view field) {
  switch (kind) {
    case AlgorithmSpec::Kind::kFixed:
      return std::nullopt;
    case AlgorithmSpec::Kind::kAimd:
      return default_limit<AimdOptions>(field);
    case AlgorithmSpec::Kind::kVegas:
      return default_limit<VegasOptions>(field);
    case AlgorithmSpec::Kind::kGradient2:
      return default_limit<Gradient2Options>(field);
  }
  return std::nullopt;
}

// An algorithm's own check ("aimd: min_limit must be <= max_limit") as an error at the field
// it names, with the algorithm's default when the file does not set that field.
void algorithm_error(ConfigSection& s, AlgorithmSpec::Kind kind, std::string_view why) {
  const std::size_t colon = why.find(": ");
  const std::string algorithm(why.substr(0, colon == std::string_view::npos ? 0 : colon));
  const std::string_view rest = colon == std::string_view::npos ? why : why.substr(colon + 2);
  const std::size_t space = rest.find(' ');
  if (space == std::string_view::npos) {
    s.error(std::string(why));
    return;
  }
  const std::string field(rest.substr(0, space));
  std::string message(rest.substr(space + 1));
  if (s.has(field)) {
    message += " (" + algorithm + "'s defaults fill in the limits not set)";
  } else {
    const std::optional<std::uint32_t> d = default_limit(kind, field);
    message += " (" + field + " is not set: " + algorithm + "'s default" +
               (d ? " is " + std::to_string(*d) : std::string(" applies")) + ")";
  }
  s.error(field, message);
}

}  // namespace

using config_detail::Reader;

bool ConfigSection::has(std::string_view key) const {
  return node(node_)[std::string(key)].IsDefined();
}

void ConfigSection::keys(std::initializer_list<std::string_view> allowed) {
  reader_->keys(node(node_), path_, allowed);
}

void ConfigSection::keys(const std::vector<std::string_view>& allowed) {
  reader_->keys(node(node_), path_, allowed);
}

std::optional<std::string> ConfigSection::one_of(std::string_view key,
                                                 const std::vector<std::string_view>& words,
                                                 bool required) {
  const std::optional<std::size_t> i = choose(key, words, required);
  if (!i) return std::nullopt;
  return std::string(words[*i]);
}

std::optional<std::string> ConfigSection::str(std::string_view key, bool required) {
  return reader_->str(node(node_), key, path_, required);
}

std::optional<std::uint64_t> ConfigSection::uint(std::string_view key, std::uint64_t min,
                                                 std::uint64_t max, bool required) {
  return reader_->uint(node(node_), key, path_, min, max, required);
}

std::optional<std::uint32_t> ConfigSection::u32(std::string_view key, std::uint32_t min) {
  return reader_->u32(node(node_), key, path_, min);
}

std::optional<bool> ConfigSection::boolean(std::string_view key) {
  return reader_->boolean(node(node_), key, path_);
}

std::optional<double> ConfigSection::number(std::string_view key, bool required) {
  const std::optional<std::string> text = reader_->str(node(node_), key, path_, required);
  if (!text) return std::nullopt;
  double v = 0;
  const char* first = text->data();
  const char* last = first + text->size();
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec != std::errc{} || end != last || text->empty() || !std::isfinite(v)) {
    error(key, "must be a number, not '" + *text + "'");
    return std::nullopt;
  }
  return v;
}

std::optional<std::vector<std::string>> ConfigSection::strings(std::string_view key) {
  const YAML::Node list = node(node_)[std::string(key)];
  const std::string path = Reader::join(path_, key);
  if (!reader_->sequence(list, path)) return std::nullopt;
  std::vector<std::string> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (!list[i].IsScalar()) {
      reader_->error(list[i], path + "[" + std::to_string(i) + "]", "must be a string");
      return std::nullopt;
    }
    out.push_back(list[i].Scalar());
  }
  return out;
}

std::optional<std::vector<std::pair<std::string, double>>> ConfigSection::numbers(
    std::string_view key) {
  std::optional<ConfigSection> m = map(key);
  if (!m) return std::nullopt;
  std::vector<std::pair<std::string, double>> out;
  for (auto it = node(m->node_).begin(); it != node(m->node_).end(); ++it) {
    if (!it->first.IsScalar()) {
      reader_->error(it->first, m->path_, "keys must be plain names");
      continue;
    }
    if (auto v = m->number(it->first.Scalar())) out.emplace_back(it->first.Scalar(), *v);
  }
  return out;
}

std::optional<Nanos> ConfigSection::duration(std::string_view key) {
  return reader_->duration(node(node_), key, path_);
}

std::optional<Nanos> ConfigSection::duration_or_zero(std::string_view key) {
  return reader_->duration(node(node_), key, path_, /*zero_ok=*/true);
}

std::optional<std::size_t> ConfigSection::choose(std::string_view key,
                                                 const std::vector<std::string_view>& words,
                                                 bool required) {
  config_detail::Names<std::size_t> names;
  for (std::size_t i = 0; i < words.size(); ++i) names.emplace_back(words[i], i);
  return reader_->choice(node(node_), key, path_, names, required);
}

std::optional<ConfigSection> ConfigSection::map(std::string_view key, bool required) {
  const YAML::Node child = node(node_)[std::string(key)];
  const std::string path = Reader::join(path_, key);
  if (!reader_->map(child, path, required)) return std::nullopt;
  return reader_->section(child, path);
}

void ConfigSection::each(std::string_view key, const std::function<void(ConfigSection&)>& f) {
  const YAML::Node list = node(node_)[std::string(key)];
  const std::string path = Reader::join(path_, key);
  if (!reader_->sequence(list, path)) return;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (!reader_->map(list[i], p, true)) continue;
    ConfigSection entry = reader_->section(list[i], p);
    f(entry);
  }
}

void ConfigSection::named(std::string_view key,
                          const std::function<void(const std::string& name, ConfigSection&)>& f) {
  const YAML::Node m = node(node_)[std::string(key)];
  const std::string path = Reader::join(path_, key);
  if (!reader_->map(m, path)) return;
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it->first.IsScalar()) {
      reader_->error(it->first, path, "keys must be plain names");
      continue;
    }
    const std::string name = it->first.Scalar();
    const std::string p = Reader::join(path, name);
    if (!reader_->map(it->second, p, true)) continue;
    ConfigSection entry = reader_->section(it->second, p);
    f(name, entry);
  }
}

void ConfigSection::error(std::string_view key, const std::string& message) {
  const YAML::Node k = node(node_)[std::string(key)];
  reader_->error(k.IsDefined() ? k : node(node_), Reader::join(path_, key), message);
}

void ConfigSection::error(const std::string& message) {
  reader_->error(node(node_), path_, message);
}

void ConfigSection::error_at(const std::string& relative, const std::string& message) {
  reader_->error_at(reader_->mark_of(path_, relative), Reader::join(path_, relative), message);
}

std::size_t ConfigSection::error_count() const noexcept { return reader_->errors.size(); }

void ConfigSection::warning_at(const std::string& relative, const std::string& message) {
  reader_->warnings.push_back(
      Reader::make(reader_->mark_of(path_, relative), Reader::join(path_, relative), message));
}

void read_algorithm(ConfigSection& s, AlgorithmSpec& out) {
  if (auto k = s.choice<AlgorithmSpec::Kind>("algorithm",
                                             {{"fixed", AlgorithmSpec::Kind::kFixed},
                                              {"aimd", AlgorithmSpec::Kind::kAimd},
                                              {"vegas", AlgorithmSpec::Kind::kVegas},
                                              {"gradient2", AlgorithmSpec::Kind::kGradient2}}))
    out.kind = *k;
  out.limit = s.u32("limit", 1);
  out.initial_limit = s.u32("initial_limit", 1);
  out.min_limit = s.u32("min_limit", 1);
  out.max_limit = s.u32("max_limit", 1);
  if (out.kind == AlgorithmSpec::Kind::kFixed) {
    // A fixed limit never moves: bounds it would not honour are refused, not ignored.
    if (!s.has("limit")) s.error("limit", "is required for the fixed algorithm");
    for (const char* field : {"initial_limit", "min_limit", "max_limit"})
      if (s.has(field))
        s.error(field,
                "applies to the adaptive algorithms only (aimd, vegas, gradient2): the fixed "
                "algorithm admits up to its limit, which never moves");
    return;
  }
  if (s.has("limit"))
    s.error("limit",
            "applies to the fixed algorithm only (use initial_limit, min_limit, max_limit)");
  if (const std::string_view why = out.validate(); !why.empty()) algorithm_error(s, out.kind, why);
}

}  // namespace sluice
