#include "top.h"

#include <fmt/core.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "sluice/v1/sluice.grpc.pb.h"

namespace sluice::cli {
namespace {

namespace pb = sluice::v1;
using nlohmann::json;

double num(const json& j, const char* key) {
  if (!j.is_object()) return 0;
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0;
}

bool admit_kind(std::string_view kind) {
  return kind == "adaptive" || kind == "concurrency" || kind == "fleet" || kind == "cascade";
}

// A policy's refusal counters by reason (what /v1/policies counts for its kind).
std::map<std::string, double> refusals(const json& p, std::string_view kind) {
  std::map<std::string, double> r;
  if (!p.is_object()) return r;
  if (kind == "rate") {
    r["denied"] = num(p, "denied");
  } else if (kind == "federated") {
    if (const auto it = p.find("refusals"); it != p.end() && it->is_object()) {
      for (const auto& [reason, n] : it->items())
        if (n.is_number()) r[reason] = n.get<double>();
    } else {
      r["denied"] = num(p, "denied");
    }
  } else if (admit_kind(kind)) {
    r["limit"] = num(p, "refused_by_limit");
    r["rate"] = num(p, "refused_by_rate");
  } else if (kind == "envoy_ratelimit") {
    r["over_limit"] = num(p, "over_limit");
  } else if (kind == "throttler") {
    double n = 0;
    if (const auto it = p.find("apps"); it != p.end() && it->is_object())
      for (const auto& [app, a] : it->items()) n += num(a, "refused");
    r["throttled"] = n;
  }
  return r;
}

// Decisions the policy has made, all told.
double decisions(const json& p, std::string_view kind) {
  if (kind == "rate" || kind == "federated") return num(p, "allowed") + num(p, "denied");
  if (admit_kind(kind))
    return num(p, "admitted") + num(p, "refused_by_limit") + num(p, "refused_by_rate");
  if (kind == "envoy_ratelimit") return num(p, "ok") + num(p, "over_limit") + num(p, "unavailable");
  if (kind == "throttler") {
    double n = 0;
    if (const auto it = p.find("apps"); it != p.end() && it->is_object())
      for (const auto& [app, a] : it->items()) n += num(a, "checks");
    return n;
  }
  return 0;
}

double per_second(double now, double before, double seconds) {
  return seconds > 0 && now >= before ? (now - before) / seconds : 0;
}

// "12", "1.5", "0.25": a figure in as few characters as it needs.
std::string figure(double v) {
  if (v >= 1e6) return fmt::format("{:.1f}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.1f}k", v / 1e3);
  if (v == static_cast<double>(static_cast<long long>(v))) return fmt::format("{}", v);
  return fmt::format("{:.{}f}", v, v < 10 ? 2 : 1);
}

std::string str(const json& j, const char* key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  if (it == j.end()) return {};
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// The kind's own column.
std::string detail(const json& p, std::string_view kind) {
  if (kind == "rate") return fmt::format("keys {} {}", figure(num(p, "keys")), str(p, "strategy"));
  if (kind == "adaptive") return str(p, "algorithm");
  if (kind == "fleet") {
    // "active L20 n3 s7": its phase, L_global, nodes, its share.
    std::string d = fmt::format("{} L{} n{} s{}", str(p, "phase"), figure(num(p, "l_global")),
                                figure(num(p, "nodes")), figure(num(p, "share")));
    if (p.value("fenced", false)) d += " fenced";
    return d;
  }
  if (kind == "federated") {
    const double held = num(p, "granted") - num(p, "spent") - num(p, "forfeited");
    return fmt::format("escrow {} {}", figure(std::max(0.0, held)), str(p, "region"));
  }
  if (kind == "concurrency") {
    const auto size = [&](const char* key) {
      const auto it = p.find(key);
      return it != p.end() && it->is_array() ? it->size() : 0;
    };
    return fmt::format("tenants {} ups {}", size("tenants"), size("upstreams"));
  }
  if (kind == "cascade") {
    int nodes = 0, open = 0;
    if (const auto it = p.find("nodes"); it != p.end() && it->is_array())
      for (const json& n : *it) {
        ++nodes;
        const json b = n.value("breaker", json::object());
        open += b.is_object() && b.value("state", std::string("closed")) != "closed";
      }
    return fmt::format("nodes {} open {}", nodes, open);
  }
  if (kind == "throttler") {
    // The metric nearest its threshold (or furthest past it): "load 1.85/32".
    std::string best;
    double worst_ratio = -1;
    if (const auto it = p.find("metrics"); it != p.end() && it->is_array())
      for (const json& m : *it) {
        double worst = 0;
        bool failed = false;
        for (const json& h : m.value("hosts", json::array())) {
          worst = std::max(worst, num(h, "value"));
          failed = failed || h.contains("error");
        }
        const double threshold = num(m, "threshold");
        const double ratio = failed ? 1e300 : threshold > 0 ? worst / threshold : 0;
        if (ratio > worst_ratio) {
          worst_ratio = ratio;
          best = failed ? str(m, "name") + " failed"
                        : fmt::format("{} {}/{}", str(m, "name"), figure(worst), figure(threshold));
        }
      }
    return worst_ratio > 1 && worst_ratio < 1e300 ? best + " OVER" : best;
  }
  if (kind == "envoy_ratelimit")
    return fmt::format("limits {} keys {}", figure(num(p, "limits")), figure(num(p, "keys")));
  return {};
}

// A reason as the narrow column shows it: federation's without their common prefixes
// ("coordinator_unreachable" -> "unreachable", "budget_spent" -> "spent").
std::string_view short_reason(std::string_view reason) {
  for (const std::string_view prefix : {"coordinator_", "budget_"})
    if (reason.starts_with(prefix)) return reason.substr(prefix.size());
  return reason;
}

std::string fit(std::string_view text, std::size_t width) {
  return std::string(text.substr(0, width));
}

const char* sort_name(TopSort s) {
  switch (s) {
    case TopSort::kName:
      return "name";
    case TopSort::kKind:
      return "kind";
    case TopSort::kUtilisation:
      return "util";
    case TopSort::kRate:
      return "rate";
    case TopSort::kRefusals:
      return "refused";
  }
  return "name";
}

// ---- the terminal ----

volatile std::sig_atomic_t g_quit = 0;
volatile std::sig_atomic_t g_resized = 0;

extern "C" void on_quit(int /*signal*/) { g_quit = 1; }
extern "C" void on_resize(int /*signal*/) { g_resized = 1; }

// Raw keys, the alternate screen and a hidden cursor while it lives; all restored when it goes
// (Ctrl-C included: it stays a signal, caught).
class Terminal {
 public:
  bool open() {
    if (tcgetattr(STDIN_FILENO, &saved_) != 0) return false;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0) return false;
    active_ = true;
    write("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");
    return true;
  }
  ~Terminal() {
    if (!active_) return;
    write("\x1b[?25h\x1b[?1049l");
    tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  Terminal() = default;
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  static void write(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::write(STDOUT_FILENO, s.data(), s.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      s.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  static void size(int& width, int& height) {
    winsize ws{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
      width = ws.ws_col;
      height = ws.ws_row;
    }
  }

 private:
  termios saved_{};
  bool active_ = false;
};

class Poller {
 public:
  explicit Poller(const ClientOptions& o)
      : options_(o),
        stub_(pb::Sluice::NewStub(
            grpc::CreateChannel(o.server, grpc::InsecureChannelCredentials()))) {}

  // The server's policies now; false (with `error`) when it does not answer.
  bool fetch(pb::ListPoliciesResponse& out, std::string& error) {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(static_cast<std::int64_t>(options_.timeout_seconds * 1e6)));
    const grpc::Status s = stub_->ListPolicies(&ctx, pb::ListPoliciesRequest{}, &out);
    if (s.ok()) return true;
    error = s.error_message().empty() ? "no answer" : s.error_message();
    return false;
  }

 private:
  const ClientOptions& options_;
  std::unique_ptr<pb::Sluice::Stub> stub_;
};

// The rows of `now`, against the states of one interval before (by policy name), which then
// become `now`'s.
std::vector<TopRow> rows_of(const pb::ListPoliciesResponse& now,
                            std::map<std::string, json>& before, double seconds) {
  std::vector<TopRow> rows;
  std::map<std::string, json> states;
  for (const auto& p : now.policies()) {
    json state = json::parse(p.state_json(), nullptr, false);
    if (!state.is_object()) state = json::object();
    state["name"] = p.name();
    state["kind"] = p.kind();
    if (!state.contains("in_flight") && admit_kind(p.kind())) state["in_flight"] = p.in_flight();
    const auto it = before.find(p.name());
    rows.push_back(top_row(state, it != before.end() ? it->second : json(), seconds));
    states[p.name()] = std::move(state);
  }
  before = std::move(states);
  return rows;
}

}  // namespace

TopRow top_row(const json& now, const json& before, double seconds) {
  TopRow r;
  r.name = str(now, "name");
  r.kind = str(now, "kind");
  const bool same = before.is_object() && str(before, "kind") == r.kind;
  if (admit_kind(r.kind)) {
    const double in_flight = num(now, "in_flight"), limit = num(now, "limit");
    r.in_flight =
        limit > 0 ? fmt::format("{}/{}", figure(in_flight), figure(limit)) : figure(in_flight);
    r.utilisation = limit > 0 ? in_flight / limit : 0;
  }
  if (same) {
    r.rate = per_second(decisions(now, r.kind), decisions(before, r.kind), seconds);
    const auto was = refusals(before, r.kind);
    double most = 0;
    for (const auto& [reason, n] : refusals(now, r.kind)) {
      const auto w = was.find(reason);
      const double v = per_second(n, w != was.end() ? w->second : n, seconds);
      r.refused += v;
      if (v > most) {
        most = v;
        r.reason = reason;
      }
    }
  }
  r.detail = detail(now, r.kind);
  return r;
}

bool parse_top_sort(const std::string& text, TopSort& out) {
  for (const TopSort s :
       {TopSort::kName, TopSort::kKind, TopSort::kUtilisation, TopSort::kRate, TopSort::kRefusals})
    if (text == sort_name(s)) {
      out = s;
      return true;
    }
  return false;
}

std::vector<std::string> top_frame(const TopView& v, int width, int height) {
  const auto w = static_cast<std::size_t>(std::max(width, 40));
  std::vector<std::string> lines;
  lines.push_back(fit(fmt::format("sluice top  {}  {}", v.server, v.status), w));
  std::vector<const TopRow*> shown;
  for (const TopRow& r : v.rows)
    if (v.filter.empty() || r.name.find(v.filter) != std::string::npos ||
        r.kind.find(v.filter) != std::string::npos)
      shown.push_back(&r);
  std::stable_sort(shown.begin(), shown.end(), [&](const TopRow* a, const TopRow* b) {
    switch (v.sort) {
      case TopSort::kKind:
        return a->kind != b->kind ? a->kind < b->kind : a->name < b->name;
      case TopSort::kUtilisation:
        return a->utilisation != b->utilisation ? a->utilisation > b->utilisation
                                                : a->name < b->name;
      case TopSort::kRate:
        return a->rate != b->rate ? a->rate > b->rate : a->name < b->name;
      case TopSort::kRefusals:
        return a->refused != b->refused ? a->refused > b->refused : a->name < b->name;
      case TopSort::kName:
        break;
    }
    return a->name < b->name;
  });
  lines.push_back(
      fit(fmt::format("{} of {} policies  sort: {}{}", shown.size(), v.rows.size(),
                      sort_name(v.sort), v.filter.empty() ? "" : "  filter: " + v.filter),
          w));
  // Columns: 14 + 11 + 9 + 7 + 16 and the kind's own column in the rest (18 at 80 columns).
  const auto row = [&](std::string_view name, std::string_view kind, std::string_view in_flight,
                       std::string_view rate, std::string_view refused, std::string_view detail) {
    std::string line = fmt::format("{:<14.14} {:<11.11} {:>9.9} {:>7.7} {:<16.16} {}", name, kind,
                                   in_flight, rate, refused, detail);
    line.erase(line.find_last_not_of(' ') + 1);
    return fit(line, w);
  };
  lines.push_back(row("POLICY", "KIND", "INFLIGHT", "RATE/S", "REFUSED/S REASON", "DETAIL"));
  const std::size_t room = static_cast<std::size_t>(std::max(height - 4, 1));
  for (std::size_t i = 0; i < shown.size() && i < room; ++i) {
    const TopRow& r = *shown[i];
    const std::string refused =
        r.refused > 0 ? fmt::format("{} {}", figure(r.refused), short_reason(r.reason)) : "0";
    lines.push_back(row(r.name, r.kind, r.in_flight, figure(r.rate), refused, r.detail));
  }
  if (shown.size() > room)
    lines.back() = fit(fmt::format("... {} more", shown.size() - room + 1), w);
  lines.push_back(fit(v.editing_filter
                          ? "filter: " + v.filter + "_  (Enter: apply, Esc: clear)"
                          : "q quit  s sort  n/k/u/r/f by name/kind/util/rate/refused  / filter",
                      w));
  return lines;
}

int run_top(const ClientOptions& o, const TopOptions& t) {
  const bool interactive = !t.once && isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
  Poller poller(o);
  TopView view;
  view.server = o.server;
  view.sort = t.sort;
  view.filter = t.filter;
  std::map<std::string, json> before;
  auto last = std::chrono::steady_clock::now();
  bool answered = false;
  // One poll: the rows against the last states, which it then keeps.
  const auto refresh = [&] {
    pb::ListPoliciesResponse resp;
    std::string error;
    const auto now = std::chrono::steady_clock::now();
    if (!poller.fetch(resp, error)) {
      view.status = "not answering: " + error;
      answered = false;
      return;
    }
    const double seconds = std::chrono::duration<double>(now - last).count();
    view.rows = rows_of(resp, before, before.empty() ? 0 : seconds);
    last = now;
    view.status =
        fmt::format("generation {}, {} lease(s)", resp.config_generation(), resp.leases());
    answered = true;
  };
  const auto interval = std::chrono::microseconds(
      static_cast<std::int64_t>(std::max(t.interval_seconds, 0.05) * 1e6));

  if (!interactive) {
    // Two polls an interval apart, so the rates are measured; then one frame, plainly.
    refresh();
    if (!answered) {
      fmt::print(stderr, "sluice: {}: {}\n", o.server, view.status);
      return 2;
    }
    std::this_thread::sleep_for(interval);
    refresh();
    if (!answered) {
      fmt::print(stderr, "sluice: {}: {}\n", o.server, view.status);
      return 2;
    }
    if (o.json) {
      json rows = json::array();
      for (const TopRow& r : view.rows)
        if (view.filter.empty() || r.name.find(view.filter) != std::string::npos ||
            r.kind.find(view.filter) != std::string::npos)
          rows.push_back({{"name", r.name},
                          {"kind", r.kind},
                          {"in_flight", r.in_flight},
                          {"utilisation", r.utilisation},
                          {"rate", r.rate},
                          {"refused", r.refused},
                          {"reason", r.reason},
                          {"detail", r.detail}});
      fmt::print("{}\n", json{{"server", o.server}, {"policies", std::move(rows)}}.dump());
      return 0;
    }
    int width = 80, height = 24;
    Terminal::size(width, height);
    std::vector<std::string> frame = top_frame(view, width, 1 << 20);
    frame.pop_back();  // no keys to tell of
    for (const std::string& line : frame) fmt::print("{}\n", line);
    return 0;
  }

  struct sigaction quit {
  }, resize{};
  quit.sa_handler = on_quit;
  resize.sa_handler = on_resize;
  sigemptyset(&quit.sa_mask);
  sigemptyset(&resize.sa_mask);
  sigaction(SIGINT, &quit, nullptr);
  sigaction(SIGTERM, &quit, nullptr);
  sigaction(SIGHUP, &quit, nullptr);
  sigaction(SIGWINCH, &resize, nullptr);
  Terminal term;
  if (!term.open()) {
    fmt::print(stderr, "sluice: top: cannot set up the terminal\n");
    return 2;
  }
  const auto draw = [&] {
    int width = 80, height = 24;
    Terminal::size(width, height);
    std::string out = "\x1b[H";
    for (const std::string& line : top_frame(view, width, height)) out += line + "\x1b[K\r\n";
    out += "\x1b[J";
    Terminal::write(out);
  };
  refresh();
  draw();
  auto next = std::chrono::steady_clock::now() + interval;
  while (g_quit == 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        next - std::chrono::steady_clock::now());
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (g_quit != 0) break;
    if (g_resized != 0) {
      g_resized = 0;
      Terminal::write("\x1b[2J");
      draw();
    }
    if (ready > 0) {
      char keys[64];
      const ssize_t n = ::read(STDIN_FILENO, keys, sizeof keys);
      if (n == 0 && (fd.revents & POLLHUP) != 0) break;  // the terminal went away
      for (ssize_t i = 0; i < n; ++i) {
        const char c = keys[i];
        if (view.editing_filter) {
          if (c == '\r' || c == '\n') {
            view.editing_filter = false;
          } else if (c == 0x1b) {  // Esc
            view.editing_filter = false;
            view.filter.clear();
          } else if (c == 0x7f || c == 0x08) {
            if (!view.filter.empty()) view.filter.pop_back();
          } else if (c >= 0x20 && c < 0x7f && view.filter.size() < 64) {
            view.filter += c;
          }
          continue;
        }
        switch (c) {
          case 'q':
          case 'Q':
          case 0x03:  // Ctrl-C, if the terminal sends it as a key
            g_quit = 1;
            break;
          case 's':
            view.sort = static_cast<TopSort>((static_cast<int>(view.sort) + 1) % 5);
            break;
          case 'n':
            view.sort = TopSort::kName;
            break;
          case 'k':
            view.sort = TopSort::kKind;
            break;
          case 'u':
            view.sort = TopSort::kUtilisation;
            break;
          case 'r':
            view.sort = TopSort::kRate;
            break;
          case 'f':
            view.sort = TopSort::kRefusals;
            break;
          case '/':
            view.editing_filter = true;
            view.filter.clear();
            break;
          case 0x1b:
            view.filter.clear();
            break;
          default:
            break;
        }
      }
      if (g_quit != 0) break;
      draw();
    } else if (ready < 0 && errno != EINTR) {
      break;
    }
    if (std::chrono::steady_clock::now() >= next) {
      refresh();
      draw();
      next += interval;
      if (next < std::chrono::steady_clock::now())
        next = std::chrono::steady_clock::now() + interval;
    }
  }
  return 0;
}

}  // namespace sluice::cli
