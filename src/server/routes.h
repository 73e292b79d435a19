// routes.h: HTTP routes and gRPC methods a policy kind brings with it, apart from any transport.
//
// What it is: a kind may answer calls of its own beside the rate and admit families (the
// throttler's `/throttler/check?app=...` and `/check/APP/TYPE/NAME`, its admin verbs, its gRPC
// method). It lists them in its registration (registry.h: PolicyKind::routes and ::methods);
// the transports serve whatever the registry lists, so a kind's routes need no edit to them.
//
//   HttpRoute   methods + a path pattern + a handler. A pattern is literal segments and `{name}`
//               segments ("/check/{app}/{type}/{name}"), each matching one non-empty segment,
//               percent-decoded. The transport parses the query (`?a=1&b=x%20y`, `+` is a
//               space) and checks the admin token when the route says `admin`.
//   GrpcMethod  a full method name ("/package.Service/Method") + a handler of the request's
//               serialized bytes (the kind parses its own message); served as a unary call.
//
// A handler answers now, or defers (completion.h): the HTTP session or gRPC call is parked and
// holds no thread until the Completion is called. It gets the policies of its kind in the
// config now serving (empty when none is configured: it says so, e.g. a 404).
//
// Router holds every kind's routes; the built-in endpoints (/v1/..., /metrics, ...) come first.
//
// Thread-safety: routes and a Router are built once, then only read (handlers run concurrently).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/completion.h"
#include "sluice/core/status.h"

namespace sluice::server {

class Policy;

using NameValues = std::vector<std::pair<std::string, std::string>>;

struct RouteRequest {
  std::string_view method;  // "GET", "HEAD", "POST", ...
  std::string_view path;    // as sent, without the query
  NameValues query;         // decoded, in order
  NameValues params;        // the pattern's {name} segments, decoded
  std::string_view body;
  std::string_view peer;  // the client's address, "ip:port" (may be empty)

  // The first query argument named `name`; nullopt when absent.
  [[nodiscard]] std::optional<std::string_view> arg(std::string_view name) const;
  // The path segment the pattern names `name` ("" when the pattern has none).
  [[nodiscard]] std::string_view param(std::string_view name) const;
};

struct RouteReply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;  // not sent for HEAD
  NameValues headers;
};

// The policies of the route's kind in the config now serving (they stay alive while held).
using KindPolicies = std::vector<std::shared_ptr<Policy>>;

struct HttpRoute {
  using Handler = std::function<Decided<RouteReply>(const RouteRequest&, const KindPolicies&,
                                                    Deferral<RouteReply>&)>;
  std::vector<std::string> methods;  // e.g. {"GET", "HEAD"}; others get 405 with Allow
  std::string pattern;               // "/throttler/check", "/check/{app}/{type}/{name}"
  bool admin = false;  // needs `Authorization: Bearer <server.admin_token>` when one is set
  Handler handle;
};

struct GrpcMethod {
  // Answers with the response message's serialized bytes; an error is the call's status.
  using Handler = std::function<Decided<std::string>(std::string_view request, const KindPolicies&,
                                                     Deferral<std::string>&)>;
  std::string name;  // "/package.Service/Method"
  Handler handle;
};

// Whether `pattern` is well formed: starts with '/', no empty segment, `{name}` segments whole
// and named uniquely. Empty when it is; else what is wrong.
[[nodiscard]] std::string check_pattern(std::string_view pattern);
// Percent-decodes `s` (and, in a query, '+' as a space); nullopt when an escape is malformed.
[[nodiscard]] std::optional<std::string> percent_decode(std::string_view s, bool query);
// Parses a query string (after '?'); an error names the argument that is malformed.
[[nodiscard]] StatusOr<NameValues> parse_query(std::string_view query);

class Router {
 public:
  struct Entry {
    std::string kind;  // whose route it is
    HttpRoute route;
    // The pattern, split once when added: its segments ("{name}" for a parameter), its shape
    // (parameters unnamed: equal shapes match the same paths) and how many are literal.
    std::vector<std::string> segments;
    std::string shape;
    int literals = 0;
  };
  struct Match {
    const Entry* entry = nullptr;
    NameValues params;
  };

  // Adds a route of `kind`; false when its pattern is malformed or the same pattern (up to
  // parameter names) is taken.
  bool add(std::string kind, HttpRoute route);
  // The route whose pattern matches `path` (literal segments before parameters, then the order
  // added); entry null when none does. A malformed escape in a segment matches nothing.
  [[nodiscard]] Match match(std::string_view path) const;
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace sluice::server
