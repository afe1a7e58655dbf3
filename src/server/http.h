#pragma once
// The HTTP exchange as the route handlers see it, free of the transport's library
// (server/http_transport.h speaks the protocol). A handler takes an HttpRequest and returns an
// HttpResponse: a whole body, or a stream the transport sends chunked (HTTP/1.1) or until close
// (HTTP/1.0).
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey {

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path and query
  std::string path;     // target without the query
  int version = 11;     // 10 or 11
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote;   // the peer's address and port
  std::string request_id;  // X-Request-Id as sent (sanitised), else one the server made
  std::chrono::steady_clock::time_point received{};  // when its last byte was read
  // Whether the client has closed its connection; callable from the handler's thread while
  // it waits for generation.
  std::function<bool()> client_gone;

  // The first header of that name (case-insensitive); "" when absent.
  std::string header(std::string_view name) const;
};

// The stream of a streaming response, written from the handler's thread. Each write blocks
// until the bytes are handed to the socket; false means the client is gone (or too slow:
// the write timed out), after which the producer should stop.
class HttpStreamWriter {
 public:
  virtual ~HttpStreamWriter() = default;
  virtual bool write(std::string_view data) = 0;
  virtual bool client_gone() = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Set: the body is what this writes (the status and headers are sent first).
  std::function<void(HttpStreamWriter&)> stream;
};

// A handler. Runs on a worker thread for routes that may wait (generation), on the
// transport's own threads for those that must answer at once (see HttpRoute::inline_).
using HttpHandler = std::function<HttpResponse(HttpRequest&)>;

}  // namespace osprey
