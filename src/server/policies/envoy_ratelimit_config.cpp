// The envoy_ratelimit kind's config: its section, and the rule files it names, read in
// envoyproxy/ratelimit's format (envoy_ratelimit.h) with their own lines and columns.
#include <algorithm>
#include <filesystem>
#include <limits>
#include <system_error>

#include "server/policies/envoy_ratelimit.h"
#include "server/policies/rate.h"

namespace sluice::server {
namespace {

namespace fs = std::filesystem;

// The keys a rule may have: envoyproxy/ratelimit's (metadata is refused with its own message).
// sluice's own two follow them.
const std::vector<std::string_view> kRuleKeys = {
    "key",           "value",           "rate_limit",      "descriptors",     "shadow_mode",
    "quota_mode",    "detailed_metric", "value_to_metric", "share_threshold", "metadata",
    "sluice_shared", "sluice_strategy"};

std::optional<rls::Limit> read_limit(ConfigSection& s) {
  s.keys({"unit", "requests_per_unit", "unlimited", "name", "replaces"});
  rls::Limit l;
  if (auto u = s.boolean("unlimited")) l.unlimited = *u;
  if (auto unit = s.str("unit")) {
    if (auto named = rls::unit_named(*unit))
      l.unit = *named;
    else
      s.error("unit",
              "must be one of second, minute, hour, day, week, month, year, not '" + *unit + "'");
  }
  if (auto n = s.uint("requests_per_unit", 0, std::numeric_limits<std::uint32_t>::max()))
    l.requests_per_unit = static_cast<std::uint32_t>(*n);
  else if (!l.unlimited && !s.has("requests_per_unit"))
    s.warning_at("requests_per_unit",
                 "is not set: 0, so every request is over this limit (as envoyproxy/ratelimit "
                 "reads it)");
  if (auto n = s.str("name")) l.name = *n;
  s.each("replaces", [&](ConfigSection& r) {
    r.keys({"name"});
    l.replaces.push_back(r.str("name").value_or(""));
  });
  return l;
}

// `shares`: the policy names a coordinator (its limits are shared unless a rule says not).
rls::DescriptorRule read_rule(ConfigSection& s, bool shares) {
  s.keys(kRuleKeys);
  rls::DescriptorRule r;
  if (s.has("metadata"))
    s.error("metadata",
            "is not supported: sluice does not answer with dynamic metadata (remove it, or keep "
            "the rule in envoyproxy/ratelimit)");
  r.key = s.str("key").value_or("");
  r.value = s.str("value").value_or("");
  if (auto l = s.map("rate_limit")) r.rate_limit = read_limit(*l);
  for (auto [field, flag] :
       {std::pair{"shadow_mode", &r.shadow_mode}, std::pair{"quota_mode", &r.quota_mode},
        std::pair{"detailed_metric", &r.detailed_metric},
        std::pair{"value_to_metric", &r.value_to_metric},
        std::pair{"share_threshold", &r.share_threshold}})
    if (auto v = s.boolean(field)) *flag = *v;
  if (auto v = s.boolean("sluice_shared")) {
    if (*v && !shares)
      s.error("sluice_shared",
              "shares this limit through the policy's coordinator, and the envoy_ratelimit "
              "policy names none (set its `coordinator`)");
    r.sluice_shared = *v;
  }
  if (auto v = s.choice<RateStrategy>("sluice_strategy",
                                      {{"fixed-window", RateStrategy::kFixedWindow},
                                       {"sliding-window", RateStrategy::kSlidingWindow},
                                       {"gcra", RateStrategy::kGcra}})) {
    r.sluice_strategy = *v;
    if (*v != RateStrategy::kFixedWindow && r.sluice_shared.value_or(shares)) {
      // Appended piece by piece: `"'" + std::string(...)` trips g++ 12's bogus -Wrestrict at
      // -O3 (GCC bug 105651).
      std::string why = "'";
      why += to_string(*v);
      why +=
          "' cannot be shared without overshoot: a shared limit is a fixed window, whose budget "
          "starts whole at each window's start and can be split into escrow; add "
          "`sluice_shared: false` to count this limit on each server";
      s.error("sluice_strategy", why);
    }
  }
  s.each("descriptors", [&](ConfigSection& d) { r.descriptors.push_back(read_rule(d, shares)); });
  return r;
}

bool is_rule_file(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".yaml" || ext == ".yml";
}

// Whether a part of `p` below `root` starts with '.' (hidden, or a ConfigMap's ..data).
bool hidden(const fs::path& p, const fs::path& root) {
  for (const fs::path& part : p.lexically_relative(root))
    if (part.string().starts_with('.')) return true;
  return false;
}

// The rule files `config` names, in order; an error when there are none or it cannot be read.
std::string rule_files(const std::string& config, std::vector<std::string>& out) {
  std::error_code ec;
  const fs::file_status st = fs::status(config, ec);
  if (ec || !fs::exists(st)) return "no such file or directory: " + config;
  if (!fs::is_directory(st)) {
    out.push_back(config);
    return {};
  }
  const fs::path root(config);
  fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec);
  if (ec) return "cannot read the directory " + config + ": " + ec.message();
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return "cannot read the directory " + config + ": " + ec.message();
    const fs::path p = it->path();
    if (hidden(p, root)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (is_rule_file(p) && it->is_regular_file(ec)) out.push_back(p.string());
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) return "the directory " + config + " holds no .yaml or .yml file";
  return {};
}

// The sharing fields: a coordinator, and what only a coordinator makes meaningful.
void read_sharing(ConfigSection& s, PolicySpec& spec, RlsSharing& out) {
  FederationOptions& o = out.options;
  o.lease_timeout = std::chrono::milliseconds(15);
  if (auto v = s.str("coordinator")) {
    if (v->empty())
      s.error("coordinator", "must name a coordinator (leave it out to count on this server)");
    else
      spec.use("coordinator", *v, CoordinatorRole::kRateBudget);
    out.coordinator = *v;
  }
  if (auto v = s.str("region")) {
    if (v->empty()) s.error("region", "must not be empty (leave it out for the server's node id)");
    o.region = *v;
  }
  if (auto v = s.uint("batch", 1, 1'000'000)) o.batch = *v;
  if (auto d = s.duration("lease_timeout")) o.lease_timeout = *d;
  if (auto d = s.duration("retry_backoff")) o.retry_backoff = *d;
  if (auto v = s.choice<RlsOutage>(
          "outage", {{"error", RlsOutage::kError}, {"over-limit", RlsOutage::kOverLimit}}))
    out.outage = *v;
  if (auto v = s.uint("io_threads", 1, 64)) out.io_threads = *v;
  if (out.coordinator.empty())
    for (const char* field :
         {"region", "batch", "lease_timeout", "retry_backoff", "outage", "io_threads"})
      if (s.has(field))
        s.error(field,
                "applies to limits shared through a coordinator, and this policy names "
                "none (set `coordinator`)");
}

}  // namespace

bool RlsSharing::same(const RlsSharing& o) const {
  return coordinator == o.coordinator && options.region == o.options.region &&
         options.batch == o.options.batch && options.lease_timeout == o.options.lease_timeout &&
         options.retry_backoff == o.options.retry_backoff && io_threads == o.io_threads &&
         outage == o.outage;
}

std::shared_ptr<const PolicyBody> parse_envoy_ratelimit(const std::string& /*name*/,
                                                        ConfigSection& s, PolicySpec& spec) {
  s.keys({"kind", "config", "merge_domains", "shadow_mode", "max_keys", "response_headers",
          "coordinator", "region", "batch", "lease_timeout", "retry_backoff", "outage",
          "io_threads", "shadow"});
  auto body = std::make_shared<EnvoyRateLimitSpec>();
  read_sharing(s, spec, body->sharing);
  const bool shares = !body->sharing.coordinator.empty();
  if (auto v = s.boolean("merge_domains")) body->merge_domains = *v;
  if (auto v = s.boolean("shadow_mode")) body->shadow_mode = *v;
  if (auto v = s.uint("max_keys", 1, kMaxRateKeys)) body->max_keys = *v;
  if (auto v = s.choice<RateLimitHeaders>("response_headers",
                                          {{"none", RateLimitHeaders::kNone},
                                           {"ietf", RateLimitHeaders::kIetf},
                                           {"x-ratelimit", RateLimitHeaders::kXRateLimit},
                                           {"both", RateLimitHeaders::kBoth}}))
    body->response_headers = *v;
  auto tree = std::make_shared<rls::RuleTree>();
  body->rules = tree;
  const std::optional<std::string> config = s.str("config", true);
  if (!config) return body;
  body->config = *config;
  if (std::string why = rule_files(*config, body->files); !why.empty()) {
    s.error("config", why);
    return body;
  }
  for (const std::string& file : body->files) {
    DocumentLoad load = load_yaml_file(
        file, "the file is empty (a rule file has a domain and descriptors)",
        [&](ConfigSection& root) {
          root.keys({"domain", "descriptors"});
          const std::string domain = root.str("domain", true).value_or("");
          std::vector<rls::DescriptorRule> rules;
          root.each("descriptors",
                    [&](ConfigSection& d) { rules.push_back(read_rule(d, shares)); });
          if (root.error_count() > 0) return;  // said already
          for (const rls::RuleError& e : tree->add(domain, rules, body->merge_domains))
            root.error_at(e.path, e.message);
        });
    for (const ConfigError& e : load.errors) s.error("config", e.to_string(file));
    for (const ConfigError& w : load.warnings) s.warning_at("config", w.to_string(file));
    // What the policy serves depends on the files: a reload sees a changed file as a change.
    spec.fingerprint += "# " + file + "\n" + load.text + "\n";
  }
  return body;
}

}  // namespace sluice::server
