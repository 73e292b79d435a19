#include "server/registry.h"

namespace sluice::server {

bool PolicyRegistry::add(PolicyKind kind) {
  if (find(kind.name) != nullptr) return false;
  // All or nothing: check every route and method on copies first.
  Router router = router_;
  for (const HttpRoute& r : kind.routes)
    if (!router.add(kind.name, r)) return false;
  std::vector<Method> methods = methods_;
  for (const GrpcMethod& m : kind.methods) {
    const bool named = m.name.size() > 3 && m.name.front() == '/' &&
                       m.name.find('/', 1) != std::string::npos && m.name.back() != '/';
    if (!named || !m.handle) return false;
    for (const Method& taken : methods)
      if (taken.method.name == m.name) return false;
    methods.push_back(Method{kind.name, m});
  }
  router_ = std::move(router);
  methods_ = std::move(methods);
  kinds_.push_back(std::move(kind));
  return true;
}

const PolicyRegistry::Method* PolicyRegistry::method(std::string_view name) const {
  for (const Method& m : methods_)
    if (m.method.name == name) return &m;
  return nullptr;
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

bool PolicyRegistry::add_backend(CoordinatorBackend backend) {
  if (backend.name.empty() || !backend.connect || find_backend(backend.name) != nullptr)
    return false;
  backends_.push_back(std::move(backend));
  return true;
}

const CoordinatorBackend* PolicyRegistry::find_backend(std::string_view name) const {
  for (const CoordinatorBackend& b : backends_)
    if (b.name == name) return &b;
  return nullptr;
}

std::vector<std::string> PolicyRegistry::coordinator_backend_names() const {
  std::vector<std::string> out;
  for (const CoordinatorBackend& b : backends_) out.push_back(b.name);
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
