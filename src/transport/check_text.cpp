// check_text.cpp: see check_text.h.
#include "transport/check_text.h"

#include <charconv>
#include <cmath>
#include <cstdint>

#include "server/json_text.h"

namespace sluice::transport {

namespace {

double ms_of(Nanos d) { return static_cast<double>(d.count()) / 1e6; }

bool json_space(char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Reads the plain shape: a cursor over the body that gives up (nullopt) at the first byte the
// shape does not allow.
class Plain {
 public:
  explicit Plain(std::string_view s) noexcept : s_(s) {}

  void space() noexcept {
    while (at_ < s_.size() && json_space(s_[at_])) ++at_;
  }
  bool take(char c) noexcept {
    space();
    if (at_ >= s_.size() || s_[at_] != c) return false;
    ++at_;
    return true;
  }
  // A string of printable ASCII without an escape.
  std::optional<std::string_view> string() noexcept {
    if (!take('"')) return std::nullopt;
    const std::size_t start = at_;
    for (; at_ < s_.size(); ++at_) {
      const auto c = static_cast<unsigned char>(s_[at_]);
      if (c == '"') return s_.substr(start, at_++ - start);
      if (c < 0x20 || c >= 0x7f || c == '\\') return std::nullopt;
    }
    return std::nullopt;
  }
  // A non-negative integer in JSON's spelling (no leading zero), at most INT64_MAX.
  std::optional<std::int64_t> integer() noexcept {
    space();
    const std::size_t start = at_;
    while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
    const std::string_view digits = s_.substr(start, at_ - start);
    if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
    // A fraction or an exponent makes it a number of another kind.
    if (at_ < s_.size() && (s_[at_] == '.' || s_[at_] == 'e' || s_[at_] == 'E'))
      return std::nullopt;
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return v;
  }
  bool at_end() noexcept {
    space();
    return at_ == s_.size();
  }

 private:
  std::string_view s_;
  std::size_t at_ = 0;
};

}  // namespace

std::optional<server::CheckCall> plain_check_body(std::string_view body) noexcept {
  Plain p(body);
  server::CheckCall c;
  bool policy = false, key = false, hits = false;
  if (!p.take('{')) return std::nullopt;
  if (!p.take('}')) {
    do {
      const std::optional<std::string_view> name = p.string();
      if (!name || !p.take(':')) return std::nullopt;
      if (*name == "policy" && !policy) {
        const auto v = p.string();
        if (!v) return std::nullopt;
        c.policy = *v;
        policy = true;
      } else if (*name == "key" && !key) {
        const auto v = p.string();
        if (!v) return std::nullopt;
        c.key = *v;
        key = true;
      } else if (*name == "hits" && !hits) {
        const auto v = p.integer();
        if (!v) return std::nullopt;
        c.hits = *v;
        hits = true;
      } else {
        return std::nullopt;  // another field, or one twice: the general reader says which
      }
    } while (p.take(','));
    if (!p.take('}')) return std::nullopt;
  }
  if (!p.at_end()) return std::nullopt;
  return c;
}

nlohmann::json decision_json(const RateDecision& d) {
  nlohmann::json j = {{"allowed", d.allowed},
                      {"limit", d.limit},
                      {"remaining", d.remaining},
                      {"reset_after_ms", ms_of(d.reset_after)}};
  if (d.would_deny) j["would_deny"] = true;  // allowed in shadow: what it would have said below
  if (!d.allowed || d.would_deny) {
    if (d.retry_after == Nanos::max())
      j["retry_after_ms"] = nullptr;  // never: more hits than the limit
    else
      j["retry_after_ms"] = ms_of(d.retry_after);
    if (!d.reason.empty()) j["reason"] = d.reason;
  }
  return j;
}

std::string check_decision_text(const RateDecision& d, const std::string& detail) {
  if (!d.allowed || d.would_deny || !detail.empty()) {
    nlohmann::json j = decision_json(d);
    if (!detail.empty()) j["detail"] = detail;
    return server::json_text(j);
  }
  // {"allowed":true,"limit":L,"remaining":R,"reset_after_ms":M}: the keys in the order the
  // document's map sorts them, the number as nlohmann writes a double.
  char text[160];
  char* at = text;
  const auto put = [&at](std::string_view s) {
    for (const char c : s) *at++ = c;
  };
  put(R"({"allowed":true,"limit":)");
  at = std::to_chars(at, text + sizeof(text), d.limit).ptr;
  put(R"(,"remaining":)");
  at = std::to_chars(at, text + sizeof(text), d.remaining).ptr;
  put(R"(,"reset_after_ms":)");
  const double ms = ms_of(d.reset_after);
  if (std::isfinite(ms))
    at = nlohmann::detail::to_chars(at, text + sizeof(text), ms);
  else
    put("null");
  put("}");
  return std::string(text, static_cast<std::size_t>(at - text));
}

}  // namespace sluice::transport
