#pragma once
// HTTP/1.1 over TCP for the server, on Boost.Beast and Asio (the library stays inside
// http_transport.cpp). A few IO threads run every connection's reads and writes
// asynchronously, each connection under its own deadlines; handlers that may wait run on
// worker threads, so a slow or idle client holds a connection, never a thread.
//
// Per connection: the request line and headers must arrive within header_timeout_s; a body
// must make progress (some bytes every body_timeout_s); an idle keep-alive connection closes
// after idle_timeout_s; at most max_requests_per_connection requests are served on one.
// Pipelined requests are read and answered one after another, in order. The parser enforces
// the limits before anything is buffered: a request line or headers past max_header_bytes
// get 431 (414 when the request line alone is), a body past max_body_bytes 413, whether it
// comes with Content-Length or chunked. Expect: 100-continue is answered 100 once the
// headers pass. HTTP/1.0 clients get replies without chunking (a stream ends at close).
// With cors_origin set, every response carries CORS headers and OPTIONS is answered 204.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/http.h"

namespace osprey {

class HttpSession;

// Where a route's handler runs.
enum class HttpLane {
  io,        // on an IO thread: must answer at once (health, metrics, model list)
  work,      // on a small pool: short CPU work (tokenize, templates)
  generate,  // on the generation pool: waits for the engine
};

struct HttpRoute {
  HttpHandler handler;  // empty: 404 (or 405, see allowed)
  HttpLane lane = HttpLane::io;
  std::string allowed;  // with no handler: the methods the path takes (405 names them)
  // On the IO thread once the request is read, before it joins its lane: a response here is
  // sent instead (admission: 429). The handler owns releasing what admission took.
  std::function<std::optional<HttpResponse>(HttpRequest&)> admit;
};

struct HttpTransportOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int n_io_threads = 2;
  int n_work_threads = 4;
  int n_generate_threads = 16;
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 16u << 10;  // the request line and every header together
  size_t max_request_line_bytes = 8u << 10;
  int header_timeout_s = 10;
  int body_timeout_s = 30;
  int write_timeout_s = 30;
  int idle_timeout_s = 5;
  int max_requests_per_connection = 1000;
  std::string cors_origin;  // "": no CORS
  // The route of a request (called on an IO thread, once its head is read).
  std::function<HttpRoute(const HttpRequest&)> route;
  // The error body of a response the transport makes itself (400, 404, 405, 413, 414, 431);
  // `req` holds what was read of the request (its path, once the request line is in).
  std::function<HttpResponse(const HttpRequest& req, int status, const std::string& message, const std::string& code)>
      error;
  // Called for each response the transport makes itself, after it is sent (or failed).
  std::function<void(const HttpRequest&, int status)> on_transport_response;
};

// Parses one request from `bytes` as a connection does (the same parser, limits and
// refusals). Returns 0 and fills `out` (head and body) for a complete request; -1 when the
// bytes end before the request does; else the status the connection refuses it with (400,
// 413, 414, 431). For fuzzing and tests.
int parse_http_request(std::string_view bytes, const HttpTransportOptions& limits, HttpRequest& out);

class HttpTransport {
 public:
  explicit HttpTransport(HttpTransportOptions options);
  ~HttpTransport();  // stop()s

  // Binds and listens; returns the port. Throws IoError when it cannot.
  int bind();
  // Starts the IO and worker threads and accepting. Throws ResourceError-like IoError
  // naming what could not be created (threads).
  void start();
  // Stops accepting new connections; open ones go on.
  void stop_accepting();
  // Requests read and not yet completely answered.
  int64_t n_in_flight() const;
  // Closes every connection, stops the threads and joins them. Handlers still running must
  // end on their own (their writes fail). Idempotent.
  void stop();

 private:
  friend class HttpSession;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey
