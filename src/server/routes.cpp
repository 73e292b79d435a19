#include "server/routes.h"

#include <algorithm>

namespace sluice::server {

namespace {

// The segments of a path ("/a/b" -> {"a", "b"}; "/" -> {}).
std::vector<std::string_view> segments(std::string_view path) {
  std::vector<std::string_view> out;
  if (path.empty() || path.front() != '/') return out;
  path.remove_prefix(1);
  if (path.empty()) return out;
  while (true) {
    const std::size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

bool is_param(std::string_view seg) {
  return seg.size() >= 2 && seg.front() == '{' && seg.back() == '}';
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The pattern with every parameter's name dropped: two patterns that match the same paths.
std::string shape(std::string_view pattern) {
  std::string out;
  for (std::string_view seg : segments(pattern)) {
    out += '/';
    out += is_param(seg) ? std::string_view("{}") : seg;
  }
  return out.empty() ? "/" : out;
}

}  // namespace

std::optional<std::string_view> RouteRequest::arg(std::string_view name) const {
  for (const auto& [k, v] : query)
    if (k == name) return std::string_view(v);
  return std::nullopt;
}

std::string_view RouteRequest::param(std::string_view name) const {
  for (const auto& [k, v] : params)
    if (k == name) return v;
  return {};
}

std::string check_pattern(std::string_view pattern) {
  if (pattern.empty() || pattern.front() != '/') return "must start with '/'";
  if (pattern == "/") return {};
  std::vector<std::string_view> names;
  for (std::string_view seg : segments(pattern)) {
    if (seg.empty()) return "has an empty segment";
    const bool opens = seg.find('{') != std::string_view::npos;
    const bool closes = seg.find('}') != std::string_view::npos;
    if (!opens && !closes) continue;
    if (!is_param(seg) || seg.size() == 2 ||
        seg.substr(1, seg.size() - 2).find_first_of("{}") != std::string_view::npos)
      return "a parameter must be a whole segment, {name}";
    const std::string_view name = seg.substr(1, seg.size() - 2);
    if (std::find(names.begin(), names.end(), name) != names.end())
      return "names parameter {" + std::string(name) + "} twice";
    names.push_back(name);
  }
  return {};
}

std::optional<std::string> percent_decode(std::string_view s, bool query) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      const int hi = hex(s[i + 1]);
      const int lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && query) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

StatusOr<NameValues> parse_query(std::string_view query) {
  NameValues out;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    auto name = percent_decode(pair.substr(0, eq), true);
    auto value = percent_decode(
        eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1), true);
    if (!name || name->empty())
      return Status(StatusCode::kInvalidArgument,
                    "query: malformed argument '" + std::string(pair.substr(0, 64)) + "'");
    if (!value)
      return Status(StatusCode::kInvalidArgument, "query: " + *name + ": malformed percent-escape");
    out.emplace_back(std::move(*name), std::move(*value));
  }
  return out;
}

bool Router::add(std::string kind, HttpRoute route) {
  if (!check_pattern(route.pattern).empty() || !route.handle || route.methods.empty()) return false;
  Entry entry{std::move(kind), std::move(route), {}, {}, 0};
  entry.shape = shape(entry.route.pattern);
  for (const Entry& e : entries_)
    if (e.shape == entry.shape) return false;
  for (std::string_view seg : segments(entry.route.pattern)) {
    entry.segments.emplace_back(seg);
    if (!is_param(seg)) ++entry.literals;
  }
  entries_.push_back(std::move(entry));
  return true;
}

Router::Match Router::match(std::string_view path) const {
  Match best;
  const std::vector<std::string_view> segs = segments(path);
  if (path != "/" && segs.empty()) return best;
  for (const Entry& e : entries_) {
    if (e.segments.size() != segs.size() ||
        (best.entry != nullptr && e.literals <= best.entry->literals))
      continue;
    NameValues params;
    bool ok = true;
    for (std::size_t i = 0; ok && i < segs.size(); ++i) {
      const std::string_view pat = e.segments[i];
      if (!is_param(pat)) {
        ok = pat == segs[i];
        continue;
      }
      auto v = segs[i].empty() ? std::nullopt : percent_decode(segs[i], false);
      ok = v.has_value();
      if (ok) params.emplace_back(std::string(pat.substr(1, pat.size() - 2)), std::move(*v));
    }
    if (ok) {
      best.entry = &e;
      best.params = std::move(params);
    }
  }
  return best;
}

}  // namespace sluice::server
