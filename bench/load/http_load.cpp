// sluice_http_load: closed-loop HTTP/1.1 load with keep-alive, for the requests wrk cannot
// measure: a HEAD answered as RFC 9110 says (with the GET's Content-Length and no body), which
// wrk's parser, never told the request was a HEAD, waits on forever.
//
// Usage: sluice_http_load HOST:PORT METHOD TARGET [--connections 32] [--threads 2]
//                         [--seconds 5]
// Each connection sends one request, reads the whole answer (Beast's parser, skipping the body
// of a HEAD's answer), and sends the next. Prints "requests/s N non-2xx M errors E".
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::atomic<std::uint64_t> done{0}, non2xx{0}, errors{0};
std::atomic<bool> stop{false};

net::awaitable<void> connection(tcp::endpoint at, http::verb method, std::string target,
                                std::string host) {
  beast::tcp_stream stream(co_await net::this_coro::executor);
  beast::error_code ec;
  co_await stream.async_connect(at, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    ++errors;
    co_return;
  }
  stream.socket().set_option(tcp::no_delay(true));
  http::request<http::empty_body> req{method, target, 11};
  req.set(http::field::host, host);
  req.set(http::field::user_agent, "sluice_http_load");
  beast::flat_buffer buffer;
  while (!stop.load(std::memory_order_relaxed)) {
    co_await http::async_write(stream, req, net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
    http::response_parser<http::string_body> parser;
    parser.skip(method == http::verb::head);
    co_await http::async_read(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
    const unsigned status = parser.get().result_int();
    if (status < 200 || status > 299) ++non2xx;
    ++done;
  }
  if (ec && !stop.load()) ++errors;
}

bool number(const char* text, int& out) {
  const char* end = text + std::strlen(text);
  const auto [p, e] = std::from_chars(text, end, out);
  return e == std::errc{} && p == end && out > 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: sluice_http_load HOST:PORT METHOD TARGET [--connections N] "
                 "[--threads N] [--seconds N]\n");
    return 2;
  }
  const std::string address = argv[1];
  const http::verb method = http::string_to_verb(argv[2]);
  const std::string target = argv[3];
  int connections = 32, threads = 2, seconds = 5;
  for (int i = 4; i + 1 < argc; i += 2) {
    int* out = std::strcmp(argv[i], "--connections") == 0 ? &connections
               : std::strcmp(argv[i], "--threads") == 0   ? &threads
               : std::strcmp(argv[i], "--seconds") == 0   ? &seconds
                                                          : nullptr;
    if (out == nullptr || !number(argv[i + 1], *out)) {
      std::fprintf(stderr, "sluice_http_load: %s: expected a positive number after it\n", argv[i]);
      return 2;
    }
  }
  const auto colon = address.rfind(':');
  int port = 0;
  if (method == http::verb::unknown || colon == std::string::npos ||
      !number(address.c_str() + colon + 1, port)) {
    std::fprintf(stderr, "sluice_http_load: expected HOST:PORT METHOD TARGET\n");
    return 2;
  }
  boost::system::error_code ec;
  const auto ip = net::ip::make_address(address.substr(0, colon), ec);
  if (ec) {
    std::fprintf(stderr, "sluice_http_load: %s: not an IP address\n", address.c_str());
    return 2;
  }
  const tcp::endpoint at(ip, static_cast<unsigned short>(port));
  std::vector<std::unique_ptr<net::io_context>> contexts;
  for (int t = 0; t < threads; ++t) contexts.push_back(std::make_unique<net::io_context>(1));
  for (int c = 0; c < connections; ++c)
    net::co_spawn(*contexts[static_cast<std::size_t>(c % threads)],
                  connection(at, method, target, address), net::detached);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (auto& ctx : contexts) workers.emplace_back([&ctx] { ctx->run(); });
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  const std::uint64_t counted = done.load();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stop = true;
  for (auto& ctx : contexts) ctx->stop();
  for (auto& w : workers) w.join();
  std::printf("requests/s %.0f non-2xx %llu errors %llu\n", static_cast<double>(counted) / elapsed,
              static_cast<unsigned long long>(non2xx.load()),
              static_cast<unsigned long long>(errors.load()));
  return errors.load() == 0 ? 0 : 1;
}
