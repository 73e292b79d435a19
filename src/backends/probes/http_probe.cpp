// The HTTP probe (probe.h): GET a URL (backends/http/http_client.h), its body's first word as the
// number, a 2xx answer required.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/http/http_client.h"
#include "backends/probes/probe.h"
#include "backends/probes/registry.h"

namespace sluice::probes {
namespace {

using backend_detail::HttpUrl;

class HttpProbe final : public Probe {
 public:
  explicit HttpProbe(HttpProbeOptions options) : options_(std::move(options)) {
    (void)backend_detail::parse_http_url(options_.url, url_);  // checked by http_url_error()
  }

  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = url_.authority();
    const auto a =
        backend_detail::http_request(url_, "GET", "", {"Accept: text/plain"}, options_.timeout);
    std::string word;
    double v = 0;
    if (!a.error.empty()) {
      s.error = options_.url + ": " + a.error;
    } else if (a.status < 200 || a.status > 299) {
      s.error = options_.url + ": answered " + std::to_string(a.status);
    } else if (!leading_number(a.body, v, word)) {
      s.error = options_.url + ": the body starts with '" + word.substr(0, 64) + "', not a number";
    } else {
      s.value = v;
      s.error.clear();
    }
  }

 private:
  const HttpProbeOptions options_;
  HttpUrl url_;
};

}  // namespace

std::string http_url_error(const std::string& url) {
  HttpUrl u;
  return backend_detail::parse_http_url(url, u);
}

std::unique_ptr<Probe> http_probe(HttpProbeOptions options) {
  return std::make_unique<HttpProbe>(std::move(options));
}

void add_http_probe(ProbeRegistry& r) {
  r.add({"http", {"url", "timeout"}, [](ProbeSettings& s, const ProbeContext& c) -> MakeProbe {
           HttpProbeOptions o;
           o.url = s.str("url", true).value_or("");
           if (s.has("url"))
             if (std::string error = http_url_error(o.url); !error.empty()) s.error("url", error);
           o.timeout = c.timeout;
           return [o](const ProbeEnv&) { return http_probe(o); };
         }});
}

}  // namespace sluice::probes
