#include "transport/http_server.h"

#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/json_text.h"

namespace sluice::transport {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;
using server::AdmitCall;
using server::AdmitResult;
using server::CheckCall;
using server::Engine;
using server::Readiness;

namespace {

// Why a request's framing cannot be trusted (RFC 9112 6.1-6.3), with the status to answer before
// closing the connection; nullopt when it can. Transfer-Encoding must be exactly "chunked": a
// coding this server does not implement is 501, a list whose final coding is not chunked (the
// body's length cannot be known) and Transfer-Encoding with Content-Length are 400. Whatever
// the parser made of such a body is never served: the connection closes after the answer, so
// no byte of it can run as a request of its own.
struct FramingError {
  http::status status;
  std::string message;
};
template <class Fields>
std::optional<FramingError> framing_error(const Fields& fields) {
  const auto te = fields.find(http::field::transfer_encoding);
  if (te == fields.end()) return std::nullopt;
  if (fields.count(http::field::transfer_encoding) > 1 ||
      fields.find(http::field::content_length) != fields.end())
    return FramingError{http::status::bad_request,
                        "Transfer-Encoding: with Content-Length or repeated, the body's length "
                        "is ambiguous"};
  std::vector<std::string> codings;
  const std::string_view list(te->value().data(), te->value().size());
  for (std::size_t at = 0; at <= list.size();) {
    std::size_t end = list.find(',', at);
    if (end == std::string_view::npos) end = list.size();
    std::string_view c = list.substr(at, end - at);
    while (!c.empty() && (c.front() == ' ' || c.front() == '\t')) c.remove_prefix(1);
    while (!c.empty() && (c.back() == ' ' || c.back() == '\t')) c.remove_suffix(1);
    if (!c.empty()) {
      std::string lower(c);
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      codings.push_back(std::move(lower));
    }
    at = end + 1;
  }
  const std::string shown(list.substr(0, 64));
  if (codings.empty() || codings.back() != "chunked")
    return FramingError{http::status::bad_request, "Transfer-Encoding: '" + shown +
                                                       "' does not end in chunked, so the "
                                                       "body's length cannot be known"};
  if (codings.size() > 1)
    return FramingError{http::status::not_implemented,
                        "Transfer-Encoding: '" + shown + "': only chunked is implemented"};
  return std::nullopt;
}

}  // namespace

// ---- the socket side ----

// A session's exchange parked until its policy decides (see HttpLater).
struct Parked {
  std::mutex mu;
  bool done = false;       // the render is in
  bool abandoned = false;  // the server stopped: drop whatever comes
  std::optional<HttpRender> render;
  server::Once<void()> wake;    // resumes the session's coroutine (posts it to its executor)
  server::Once<void()> cancel;  // the policy's: the client closed its connection meanwhile
  bool gone = false;            // the client closed it (cancel ran, or runs when given)
};

// g++ 12 reports the coroutine frame's own sized operator delete (asio's awaitable frame) as
// mismatched with the operator new that allocated it, which is the frame's own too: a false
// positive of its coroutine lowering once a coroutine has a few more suspension points.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

struct HttpServer::Impl {
  Engine& engine;
  std::function<ReloadOutcome()> reload;
  net::io_context ioc;
  HttpOptions options;
  std::optional<Listener> listener;
  std::vector<std::thread> threads;
  bool stopped = false;
  std::mutex parked_mu;
  std::set<std::shared_ptr<Parked>> parked;  // every parked exchange until its session resumes

  Impl(Engine& e, std::function<ReloadOutcome()> r) : engine(e), reload(std::move(r)) {}

  class SessionLater final : public HttpLater {
   public:
    explicit SessionLater(Impl& impl) : impl_(impl) {}
    server::Once<void(HttpRender)> park() override {
      parked_ = std::make_shared<Parked>();
      {
        const std::lock_guard lock(impl_.parked_mu);
        impl_.parked.insert(parked_);
      }
      return [p = parked_](HttpRender r) mutable {
        // Under the lock, so that stop() (which abandons under it) never sees a wake half done.
        const std::lock_guard lock(p->mu);
        if (p->abandoned) return;
        p->render.emplace(std::move(r));
        p->done = true;
        if (p->wake) p->wake();
      };
    }
    void on_cancel(server::Once<void()> hook) override {
      if (parked_ == nullptr) return;
      {
        const std::lock_guard lock(parked_->mu);
        if (!parked_->gone) {
          parked_->cancel = std::move(hook);
          return;
        }
      }
      hook();  // the client is gone already
    }
    [[nodiscard]] const std::shared_ptr<Parked>& parked() const { return parked_; }

   private:
    Impl& impl_;
    std::shared_ptr<Parked> parked_;
  };

  // Resumes the session (through `handler`, its coroutine's) once `p`'s render is in.
  template <class Handler>
  static void when_rendered(const std::shared_ptr<Parked>& p, Handler handler) {
    const std::lock_guard lock(p->mu);
    auto post = [h = std::move(handler)]() mutable {
      auto ex = net::get_associated_executor(h);
      net::post(ex, std::move(h));
    };
    if (p->done)
      post();
    else
      p->wake = std::move(post);
  }

  // While `p` is parked: tells its policy (Parked::cancel) when the client closes the
  // connection. A readable socket is peeked, not read: end of stream (or an error) is the client
  // gone; bytes are a pipelined request, left for the session (the watch ends there). The
  // session cancels the wait once it resumes; a wake that finds the render in does nothing, so
  // the socket is never touched after the session moved on.
  static void watch_close(tcp::socket& socket, const std::shared_ptr<Parked>& p) {
    socket.async_wait(
        tcp::socket::wait_read, [p, fd = socket.native_handle()](const beast::error_code& ec) {
          if (ec) return;  // cancelled: the session resumed
          server::Once<void()> hook;
          {
            const std::lock_guard lock(p->mu);
            if (p->done || p->abandoned) return;
            char c = 0;
            const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
              return;
            p->gone = true;
            hook = std::move(p->cancel);
          }
          if (hook) hook();
        });
  }

  // The parked exchange's render, once its session resumed.
  HttpRender take_render(const std::shared_ptr<Parked>& p) {
    {
      const std::lock_guard lock(parked_mu);
      parked.erase(p);
    }
    return std::move(*p->render);
  }

  // Writes a response that ends the connection (the request could not be read as one).
  static net::awaitable<void> refuse(beast::tcp_stream& stream, http::status status,
                                     std::string_view code, std::string message, Nanos timeout) {
    http::response<http::string_body> res{status, 11};
    res.set(http::field::server, "sluice");
    res.set(http::field::content_type, "application/json");
    res.keep_alive(false);
    res.body() =
        server::json_text(json{{"error", {{"code", code}, {"message", std::move(message)}}}});
    res.prepare_payload();
    beast::error_code ec;
    stream.expires_after(timeout);
    co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;
    // A lingering close: a client still sending the request reads the answer instead of a
    // reset. What it still sends is read and dropped, for `timeout` and 4 MiB at most.
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream.expires_after(timeout);
    std::array<char, 16384> sink{};
    for (std::size_t dropped = 0; dropped < (4U << 20);) {
      dropped += co_await stream.async_read_some(net::buffer(sink),
                                                 net::redirect_error(net::use_awaitable, ec));
      if (ec) break;
    }
  }

  // Parses the request in `buffer` into `parser` up to the end of its header (header_only) or
  // of the whole request, reading more from `stream` only when the buffer holds too little.
  // Beast's async_read_header and async_read do the same, with the same errors (end_of_stream
  // for a connection closed before a byte of the request, put_eof's for one closed within it,
  // buffer_overflow), but post their completion through the executor when no read was needed:
  // a request that arrived whole is parsed here without that trip.
  static net::awaitable<beast::error_code> parse(beast::tcp_stream& stream,
                                                 beast::flat_buffer& buffer,
                                                 http::request_parser<http::string_body>& parser,
                                                 bool header_only) {
    beast::error_code ec;
    parser.eager(!header_only);  // as Beast's reads set it: the body in as few puts as it takes
    const auto done = [&] { return header_only ? parser.is_header_done() : parser.is_done(); };
    while (!done()) {
      if (buffer.size() > 0) {
        const std::size_t used = parser.put(buffer.data(), ec);
        buffer.consume(used);
        if (ec != http::error::need_more) {
          if (ec) co_return ec;
          continue;
        }
        ec = {};
      }
      const std::size_t room = beast::read_size(buffer, 65536);
      if (room == 0) co_return http::error::buffer_overflow;
      const std::size_t n = co_await stream.async_read_some(
          buffer.prepare(room), net::redirect_error(net::use_awaitable, ec));
      buffer.commit(n);
      if (ec == net::error::eof) {
        if (!parser.got_some()) co_return http::error::end_of_stream;
        ec = {};
        parser.put_eof(ec);  // the end of a body that runs to the close, or partial_message
        co_return ec;
      }
      if (ec) co_return ec;
    }
    co_return ec;
  }

  // `slot` counts the connection under the listener's cap while the session lives.
  net::awaitable<void> session(tcp::socket socket, [[maybe_unused]] Listener::Slot slot) {
    beast::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);
    std::string peer;
    if (auto ep = socket.remote_endpoint(ec); !ec)
      peer = ep.address().to_string() + ":" + std::to_string(ep.port());
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    while (true) {
      if (buffer.size() == 0) {
        // Between requests: the connection may idle this long for the next one's first byte.
        stream.expires_after(options.idle_timeout);
        const std::size_t n = co_await stream.async_read_some(
            buffer.prepare(4096), net::redirect_error(net::use_awaitable, ec));
        if (ec) break;
        buffer.commit(n);
      }
      // From its first byte, the whole request within request_timeout (no slow trickle); past
      // it the stream closes the connection (as it does an idle one), with nothing to say.
      stream.expires_after(options.request_timeout);
      http::request_parser<http::string_body> parser;
      parser.header_limit(8 * 1024);
      parser.body_limit(1 << 20);
      // The header first: what it says about the body is judged before a byte of the body is
      // read as one.
      ec = co_await parse(stream, buffer, parser, /*header_only=*/true);
      if (!ec) {
        // The 8 KiB bound is the whole header's (the parser's own holds per read): the request
        // line and every field line, as sent.
        std::size_t header_bytes =
            parser.get().method_string().size() + parser.get().target().size() + 12;
        for (const auto& f : parser.get())
          header_bytes += f.name_string().size() + f.value().size() + 4;
        std::optional<FramingError> bad;
        if (header_bytes > 8 * 1024)
          bad = FramingError{http::status::request_header_fields_too_large, ""};
        else
          bad = framing_error(parser.get());
        if (bad) {
          if (bad->status == http::status::request_header_fields_too_large)
            co_await refuse(stream, bad->status, "request_header_fields_too_large",
                            "headers: larger than 8 KiB in all", options.request_timeout);
          else
            co_await refuse(
                stream, bad->status,
                bad->status == http::status::not_implemented ? "not_implemented" : "bad_request",
                std::move(bad->message), options.request_timeout);
          break;
        }
        ec = co_await parse(stream, buffer, parser, /*header_only=*/false);
      }
      if (ec == http::error::body_limit) {
        co_await refuse(stream, http::status::payload_too_large, "payload_too_large",
                        "body: larger than 1 MiB", options.request_timeout);
        break;
      }
      if (ec == http::error::header_limit) {
        co_await refuse(stream, http::status::request_header_fields_too_large,
                        "request_header_fields_too_large", "headers: larger than 8 KiB in all",
                        options.request_timeout);
        break;
      }
      if (ec == http::error::end_of_stream || ec == net::error::eof) break;
      if (ec && ec.category() == http::make_error_code(http::error::bad_target).category()) {
        co_await refuse(stream, http::status::bad_request, "bad_request",
                        "request: not valid HTTP/1.1 (" + ec.message() + ")",
                        options.request_timeout);
        break;
      }
      if (ec) break;
      http::request<http::string_body> req = parser.release();
      HttpExchange x;
      x.method = std::string(req.method_string());
      x.target = std::string(req.target());
      x.body = std::move(req.body());
      x.peer = peer;
      if (auto a = req.find(http::field::authorization); a != req.end())
        x.authorization = std::string(a->value());
      SessionLater later(*this);
      handle_http(engine, reload, x, later);
      if (const std::shared_ptr<Parked>& p = later.parked()) {
        watch_close(stream.socket(), p);
        co_await net::async_initiate<const net::use_awaitable_t<>&, void()>(
            [&p](auto handler) { when_rendered(p, std::move(handler)); }, net::use_awaitable);
        stream.socket().cancel(ec);  // the close watch, if it still waits
        take_render(p)(x);
      }
      http::response<http::string_body> res{static_cast<http::status>(x.status), req.version()};
      res.set(http::field::server, "sluice");
      res.set(http::field::content_type, x.content_type);
      for (const auto& [k, v] : x.headers) res.set(k, v);
      res.keep_alive(req.keep_alive());
      if (req.method() != http::verb::head) {
        res.body() = std::move(x.response);
        res.prepare_payload();
      } else {
        res.content_length(x.response.size());  // the GET's length (RFC 9110 9.3.2), no body
      }
      stream.expires_after(options.request_timeout);
      co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
      if (ec || !res.keep_alive()) break;
    }
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  // A connection past the cap: told so in one write that cannot block, then closed.
  static void shed(int fd) {
    static const std::string kBusy = [] {
      const std::string body =
          R"({"error":{"code":"unavailable","message":"connections: the server is at its )"
          R"(connection cap"}})";
      return "HTTP/1.1 503 Service Unavailable\r\nServer: sluice\r\nRetry-After: 1\r\n"
             "Content-Type: application/json\r\nConnection: close\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
    }();
    (void)::send(fd, kBusy.data(), kBusy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
};

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

HttpServer::HttpServer(Engine& engine, std::function<ReloadOutcome()> reload)
    : impl_(std::make_unique<Impl>(engine, std::move(reload))) {}

HttpServer::~HttpServer() { stop(); }

StatusOr<int> HttpServer::start(const std::string& address, const HttpOptions& options) {
  impl_->options = options;
  Listener& l = impl_->listener.emplace(impl_->ioc, "http", options.listener);
  auto bound = l.bind(address, /*min_port=*/0);
  if (!bound.ok()) {
    impl_->listener.reset();
    return bound.status();
  }
  l.start(
      [impl = impl_.get(), protocol = l.protocol()](int fd, Listener::Slot slot) {
        tcp::socket socket(impl->ioc);
        beast::error_code ec;
        socket.assign(protocol, fd, ec);
        if (ec) {
          ::close(fd);
          return;
        }
        net::co_spawn(impl->ioc, impl->session(std::move(socket), std::move(slot)), net::detached);
      },
      &Impl::shed);
  impl_->engine.attach("http", &l);
  for (int i = 0; i < std::max(1, options.threads); ++i)
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  return bound.value();
}

void HttpServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  // Parked sessions will not resume: a decision that comes later is dropped, and each parked
  // coroutine (its socket with it) is destroyed here, while the context still exists.
  std::set<std::shared_ptr<Parked>> parked;
  {
    const std::lock_guard lock(impl_->parked_mu);
    parked.swap(impl_->parked);
  }
  for (const auto& p : parked) {
    server::Once<void()> wake;
    {
      const std::lock_guard lock(p->mu);
      p->abandoned = true;
      wake = std::move(p->wake);
    }
  }
  // No thread runs the context any more: the listening socket can be closed here, at once.
  if (impl_->listener) {
    impl_->engine.detach(&*impl_->listener);
    impl_->listener->close();
  }
}

}  // namespace sluice::transport
