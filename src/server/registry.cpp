#include "server/registry.h"

namespace sluice::server {

bool PolicyRegistry::add(PolicyKind kind) {
  if (find(kind.name) != nullptr) return false;
  kinds_.push_back(std::move(kind));
  return true;
}

const PolicyKind* PolicyRegistry::find(std::string_view name) const {
  for (const PolicyKind& k : kinds_)
    if (k.name == name) return &k;
  return nullptr;
}

std::vector<std::string> PolicyRegistry::kinds_of(bool PolicyKindParser::*family) const {
  std::vector<std::string> out;
  for (const PolicyKind& k : kinds_)
    if (k.*family) out.push_back(k.name);
  return out;
}

std::vector<std::string> PolicyRegistry::kind_names() const {
  std::vector<std::string> out;
  for (const PolicyKind& k : kinds_) out.push_back(k.name);
  return out;
}

std::string kinds_phrase(const std::vector<std::string>& kinds) {
  if (kinds.empty()) return "no policy";
  const char first = kinds.front().front();
  std::string out = std::string("aeiou").find(first) != std::string::npos ? "an " : "a ";
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (i > 0) out += i + 1 == kinds.size() ? " or " : ", ";
    out += kinds[i];
  }
  return out + " policy";
}

}  // namespace sluice::server
