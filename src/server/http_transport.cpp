#include "server/http_transport.h"

#include <sys/socket.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace osprey {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = beast::error_code;

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, name)) return v;
  return {};
}

namespace {

// A fixed set of threads taking jobs in order.
class JobPool {
 public:
  void start(int n, const char* what) {
    for (int i = 0; i < n; ++i) {
      try {
        threads_.emplace_back([this] { run(); });
      } catch (const std::system_error& e) {
        throw IoError(std::string("cannot start the ") + what + " threads (" + std::to_string(n) + "): " + e.what());
      }
    }
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  // Runs the jobs already posted, then joins.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

// X-Request-Id as sent, when it is printable ASCII of a sane length; "" otherwise.
std::string clean_request_id(const std::string& id) {
  if (id.empty() || id.size() > 128) return {};
  for (unsigned char c : id)
    if (c < 0x21 || c > 0x7e) return {};
  return id;
}

std::string new_request_id() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t seed = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)seed,
                (unsigned long long)(counter.fetch_add(1) & 0xffffffffu));
  return buf;
}

using Parser = http::request_parser<http::string_body>;

void configure(Parser& p, const HttpTransportOptions& o) {
  p.header_limit(std::uint32_t(std::min<size_t>(o.max_header_bytes, UINT32_MAX)));
  p.body_limit(o.max_body_bytes);
}

// The status a parse error is refused with.
int refusal(error_code ec, const Parser& p) {
  if (ec == http::error::header_limit) {
    // The parser takes the request line as soon as it is whole: past the limit without it,
    // the request line alone is too long (414); else the headers are (431).
    return p.get().target().empty() ? 414 : 431;
  }
  if (ec == http::error::body_limit) return 413;
  return 400;
}

void fill_head(HttpRequest& r, const Parser::value_type& h) {
  r.method = std::string(h.method_string());
  r.target = std::string(h.target());
  r.path = r.target.substr(0, r.target.find('?'));
  r.version = h.version() == 10 ? 10 : 11;
  r.headers.clear();
  for (const auto& f : h) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  r.request_id = clean_request_id(r.header("X-Request-Id"));
  if (r.request_id.empty()) r.request_id = new_request_id();
}

}  // namespace

int parse_http_request(std::string_view bytes, const HttpTransportOptions& limits, HttpRequest& out) {
  Parser p;
  configure(p, limits);
  p.eager(true);
  error_code ec;
  size_t used = 0;
  while (used < bytes.size() && !p.is_done()) {
    const size_t n = p.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) return refusal(ec, p);
    if (n == 0) break;
    used += n;
  }
  if (!p.is_done()) return -1;
  if (p.get().target().size() > limits.max_request_line_bytes) return 414;
  fill_head(out, p.get());
  out.body = p.release().body();
  return 0;
}

class HttpSession;

struct HttpTransport::Impl {
  HttpTransportOptions opt;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> io_threads;
  JobPool work_pool, generate_pool;
  std::atomic<int64_t> in_flight{0};
  std::atomic<bool> stopping{false};
  std::mutex sessions_mu;
  std::set<std::weak_ptr<HttpSession>, std::owner_less<std::weak_ptr<HttpSession>>> sessions;
  bool started = false, stopped = false;

  explicit Impl(HttpTransportOptions o) : opt(std::move(o)) {}
  void accept();
};

// One connection. Every read and write runs on the connection's strand; a handler on a worker
// thread writes through blocking_write(), which posts to the strand and waits.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(HttpTransport::Impl& t, tcp::socket socket) : t_(t), stream_(std::move(socket)) {}

  void start() {
    error_code ec;
    const auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }

  // On any thread: ends the connection (shutdown).
  void close() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      self->stream_.close();
    });
  }

 private:
  void read_header() {
    if (t_.stopping) return close_now();
    if (n_requests_ > 0 && buffer_.size() == 0) return wait_idle();
    parser_.emplace();
    configure(*parser_, t_.opt);
    stream_.expires_after(std::chrono::seconds(t_.opt.header_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  // A kept-alive connection between requests: its next bytes must come within the idle
  // deadline; from them on the header deadline runs.
  void wait_idle() {
    stream_.expires_after(std::chrono::seconds(t_.opt.idle_timeout_s));
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      if (ec) return self->close_now();
      self->buffer_.commit(n);
      self->read_header();
    });
  }

  void on_header(error_code ec) {
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset || ec == net::error::eof)
      return close_now();
    head_ = {};
    head_.remote = remote_;
    if (ec) {
      switch (refusal(ec, *parser_)) {
        case 414: return refuse_long_line();
        case 431:
          return refuse(431, "the request headers exceed " + std::to_string(t_.opt.max_header_bytes) + " bytes",
                        "headers_too_large");
        case 413: return refuse_body_limit();
        default: return refuse(400, std::string("malformed HTTP request: ") + ec.message(), "bad_http_request");
      }
    }
    const auto& h = parser_->get();
    fill_head(head_, h);
    head_.remote = remote_;
    keep_alive_ = h.keep_alive();
    if (h.target().size() > t_.opt.max_request_line_bytes) return refuse_long_line();
    ++n_requests_;
    if (!parser_->is_done() && beast::iequals(h[http::field::expect], "100-continue") && h.version() == 11) {
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      stream_.expires_after(std::chrono::seconds(t_.opt.write_timeout_s));
      http::async_write(stream_, *cont, [self = shared_from_this(), cont](error_code e, size_t) {
        if (e) return self->close_now();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  // Reads the body: each read must bring bytes within the body deadline.
  void read_body() {
    if (parser_->is_done()) return on_request();
    stream_.expires_after(std::chrono::seconds(t_.opt.body_timeout_s));
    http::async_read_some(stream_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (ec == http::error::body_limit) return self->refuse_body_limit();
      if (ec == beast::error::timeout) return self->close_now();
      if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
          ec == net::error::operation_aborted)
        return self->close_now();
      if (ec) return self->refuse(400, std::string("malformed HTTP request body: ") + ec.message(), "bad_http_request");
      self->read_body();
    });
  }

  void refuse_long_line() {
    refuse(414, "the request line exceeds " + std::to_string(t_.opt.max_request_line_bytes) + " bytes", "uri_too_long");
  }

  void refuse_body_limit() {
    refuse(413, "the request body exceeds the limit of " + std::to_string(t_.opt.max_body_bytes) + " bytes",
           "request_too_large");
  }

  // A response the transport makes itself; the connection closes after it (the rest of
  // the request is unread).
  void refuse(int status, const std::string& message, const std::string& code) {
    keep_alive_ = false;
    linger_ = true;
    if (head_.request_id.empty()) head_.request_id = new_request_id();
    HttpResponse r = t_.opt.error(head_, status, message, code);
    if (t_.opt.on_transport_response) t_.opt.on_transport_response(head_, status);
    write_whole(std::move(r), false);
  }

  void on_request() {
    head_.body = parser_->release().body();
    head_.received = std::chrono::steady_clock::now();
    parser_.reset();
    if (n_requests_ >= t_.opt.max_requests_per_connection) keep_alive_ = false;
    if (!t_.opt.cors_origin.empty() && head_.method == "OPTIONS") {
      HttpResponse r;
      r.status = 204;
      r.content_type.clear();
      const std::string asked = head_.header("Access-Control-Request-Headers");
      r.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      r.headers.emplace_back("Access-Control-Allow-Headers",
                             asked.empty() ? "Authorization, Content-Type, X-Request-Id" : asked);
      r.headers.emplace_back("Access-Control-Max-Age", "86400");
      if (t_.opt.on_transport_response) t_.opt.on_transport_response(head_, 204);
      return write_whole(std::move(r), keep_alive_);
    }
    auto weak = weak_from_this();
    std::weak_ptr<HttpSession> w = weak;
    const int fd = stream_.socket().native_handle();
    head_.client_gone = [w, fd] {
      auto s = w.lock();
      return !s || s->peer_gone(fd);
    };
    HttpRoute route = t_.opt.route(head_);
    if (!route.handler) {
      if (!route.allowed.empty()) {
        HttpResponse r = t_.opt.error(head_, 405, "method " + head_.method + " is not allowed on " + head_.path, "");
        r.headers.emplace_back("Allow", route.allowed);
        if (t_.opt.on_transport_response) t_.opt.on_transport_response(head_, 405);
        return write_whole(std::move(r), keep_alive_);
      }
      HttpResponse r = t_.opt.error(head_, 404, "no route " + head_.method + " " + head_.path, "not_found");
      if (t_.opt.on_transport_response) t_.opt.on_transport_response(head_, 404);
      return write_whole(std::move(r), keep_alive_);
    }
    if (route.admit) {
      if (std::optional<HttpResponse> refused = route.admit(head_)) return write_whole(std::move(*refused), keep_alive_);
    }
    if (route.lane == HttpLane::io) {
      HttpResponse r = route.handler(head_);
      return write_whole(std::move(r), keep_alive_);
    }
    ++t_.in_flight;
    auto job = [self = shared_from_this(), handler = std::move(route.handler)]() mutable { self->run(handler); };
    (route.lane == HttpLane::work ? t_.work_pool : t_.generate_pool).post(std::move(job));
  }

  // On a worker thread.
  void run(HttpHandler& handler) {
    HttpResponse r = handler(head_);
    if (!r.stream) {
      net::post(stream_.get_executor(), [self = shared_from_this(), r = std::move(r)]() mutable {
        --self->t_.in_flight;
        self->write_whole(std::move(r), self->keep_alive_);
      });
      return;
    }
    const bool chunked = head_.version == 11;
    if (!chunked) keep_alive_ = false;
    http::response<http::empty_body> res{http::int_to_status(unsigned(r.status)), unsigned(head_.version)};
    add_headers(res, r);
    res.keep_alive(keep_alive_);
    if (chunked) res.chunked(true);
    std::ostringstream os;
    os << res.base();
    StreamWriter writer(*this, chunked);
    bool ok = writer.raw(os.str());
    if (ok) {
      r.stream(writer);
      ok = !writer.failed() && (!chunked || writer.raw("0\r\n\r\n"));
    }
    r.stream = nullptr;
    net::post(stream_.get_executor(), [self = shared_from_this(), ok] {
      --self->t_.in_flight;
      if (ok && self->keep_alive_) return self->read_header();
      self->close_now();
    });
  }

  class StreamWriter : public HttpStreamWriter {
   public:
    StreamWriter(HttpSession& s, bool chunked) : s_(s), chunked_(chunked) {}
    bool write(std::string_view data) override {
      if (failed_) return false;
      if (data.empty()) return true;
      if (!chunked_) return raw(std::string(data));
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      return raw(std::string(size) + std::string(data) + "\r\n");
    }
    bool client_gone() override { return failed_ || s_.peer_gone(s_.stream_.socket().native_handle()); }
    bool raw(std::string bytes) {
      if (failed_) return false;
      failed_ = !s_.blocking_write(std::move(bytes));
      return !failed_;
    }
    bool failed() const { return failed_; }

   private:
    HttpSession& s_;
    bool chunked_;
    bool failed_ = false;
  };

  // From a worker thread: writes the bytes on the strand and waits for the write to end.
  bool blocking_write(std::string bytes) {
    struct Shared {
      std::string bytes;
      std::promise<bool> done;
    };
    auto sh = std::make_shared<Shared>();
    sh->bytes = std::move(bytes);
    std::future<bool> f = sh->done.get_future();
    net::post(stream_.get_executor(), [self = shared_from_this(), sh] {
      self->stream_.expires_after(std::chrono::seconds(self->t_.opt.write_timeout_s));
      net::async_write(self->stream_, net::buffer(sh->bytes),
                       [sh](error_code ec, size_t) { sh->done.set_value(!ec); });
    });
    // The deadline above ends the write; this wait only guards against a stopped loop.
    if (f.wait_for(std::chrono::seconds(t_.opt.write_timeout_s + 2)) != std::future_status::ready) return false;
    return f.get();
  }

  // Whether the client closed its end (a read would return end of file or an error).
  bool peer_gone(int fd) const {
    if (fd < 0) return true;
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }

  template <class Res>
  void add_headers(Res& res, const HttpResponse& r) {
    if (!r.content_type.empty()) res.set(http::field::content_type, r.content_type);
    res.set(http::field::server, "osprey");
    res.set("X-Request-Id", head_.request_id);
    for (const auto& [k, v] : r.headers) res.set(k, v);
    if (!t_.opt.cors_origin.empty()) {
      res.set(http::field::access_control_allow_origin, t_.opt.cors_origin);
      if (t_.opt.cors_origin != "*") res.set(http::field::vary, "Origin");
      res.set(http::field::access_control_expose_headers, "X-Request-Id, Retry-After");
    }
  }

  // On the strand: writes a whole response, then reads the next request or closes.
  void write_whole(HttpResponse r, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(http::int_to_status(unsigned(r.status)),
                                                                    unsigned(head_.version == 10 ? 10 : 11));
    add_headers(*res, r);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive);
    res->prepare_payload();
    // HEAD: the headers a GET gets, Content-Length included, and no body.
    if (head_.method == "HEAD") res->body().clear();
    stream_.expires_after(std::chrono::seconds(t_.opt.write_timeout_s));
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep_alive](error_code ec, size_t) {
      if (ec || !keep_alive) return self->close_now();
      self->read_header();
    });
  }

  void close_now() {
    error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (linger_ && !t_.stopping) {
      // After a refusal the client may still be sending what was refused: closing with
      // unread bytes resets the connection, which can destroy the answer before the client
      // reads it. Read and drop a bounded amount for a short while first (a lingering close).
      linger_ = false;
      linger_left_ = 16 << 20;
      linger_buffer_.resize(16 << 10);
      stream_.expires_after(std::chrono::seconds(1));
      return discard();
    }
    stream_.close();
  }

  void discard() {
    stream_.async_read_some(net::buffer(linger_buffer_), [self = shared_from_this()](error_code ec, size_t n) {
      if (ec || n >= self->linger_left_) return self->stream_.close();
      self->linger_left_ -= n;
      self->discard();
    });
  }

  HttpTransport::Impl& t_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  HttpRequest head_;
  std::string remote_;
  bool keep_alive_ = true;
  bool linger_ = false;  // close_now() drains the socket first (after a refusal)
  size_t linger_left_ = 0;
  std::vector<char> linger_buffer_;
  int n_requests_ = 0;
};

void HttpTransport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      // Out of descriptors and the like: try again shortly rather than spin.
      log_warn(std::string("accept: ") + ec.message());
      auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
      timer->async_wait([this, timer](error_code) {
        if (acceptor.is_open()) accept();
      });
      return;
    }
    auto s = std::make_shared<HttpSession>(*this, std::move(socket));
    {
      std::lock_guard<std::mutex> lock(sessions_mu);
      for (auto it = sessions.begin(); it != sessions.end();) it = it->expired() ? sessions.erase(it) : std::next(it);
      sessions.insert(s);
    }
    s->start();
    accept();
  });
}

HttpTransport::HttpTransport(HttpTransportOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpTransport::~HttpTransport() { stop(); }

int HttpTransport::bind() {
  Impl& m = *impl_;
  error_code ec;
  const auto address = net::ip::make_address(m.opt.host, ec);
  if (ec) throw IoError("cannot listen on " + m.opt.host + ": not an IP address (" + ec.message() + ")");
  const tcp::endpoint ep(address, net::ip::port_type(m.opt.port));
  auto fail = [&](const char* what) {
    throw IoError("cannot listen on " + m.opt.host + ":" + std::to_string(m.opt.port) + ": " + what + ": " + ec.message());
  };
  m.acceptor.open(ep.protocol(), ec);
  if (ec) fail("socket");
  m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  m.acceptor.bind(ep, ec);
  if (ec) fail("bind");
  m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("listen");
  m.opt.port = m.acceptor.local_endpoint().port();
  return m.opt.port;
}

void HttpTransport::start() {
  Impl& m = *impl_;
  m.work.emplace(m.ioc.get_executor());
  m.started = true;
  m.work_pool.start(m.opt.n_work_threads, "HTTP work");
  m.generate_pool.start(m.opt.n_generate_threads, "HTTP generation");
  for (int i = 0; i < m.opt.n_io_threads; ++i) {
    try {
      m.io_threads.emplace_back([&m] { m.ioc.run(); });
    } catch (const std::system_error& e) {
      throw IoError("cannot start the HTTP IO threads: " + std::string(e.what()));
    }
  }
  net::post(m.ioc, [&m] { m.accept(); });
}

void HttpTransport::stop_accepting() {
  Impl& m = *impl_;
  net::post(m.ioc, [&m] {
    error_code ec;
    m.acceptor.close(ec);
  });
}

int64_t HttpTransport::n_in_flight() const { return impl_->in_flight.load(); }

void HttpTransport::stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  m.stopping = true;
  if (!m.started) {
    error_code ec;
    m.acceptor.close(ec);
    return;
  }
  stop_accepting();
  {
    std::lock_guard<std::mutex> lock(m.sessions_mu);
    for (const auto& w : m.sessions)
      if (auto s = w.lock()) s->close();
  }
  // Handlers still running see their writes fail and end; the pools join them.
  m.work_pool.stop();
  m.generate_pool.stop();
  m.work.reset();
  m.ioc.stop();
  for (auto& t : m.io_threads)
    if (t.joinable()) t.join();
}

}  // namespace osprey
