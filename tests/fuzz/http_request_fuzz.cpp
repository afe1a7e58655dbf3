// The server's HTTP request parsing (server/http_transport.h): a request line, headers and a
// body (Content-Length or chunked) under small limits. Every input is a request, a need for
// more bytes or a refusal with 400, 413, 414 or 431; an accepted one keeps within the limits.
#include <cstdlib>
#include <string_view>

#include "fuzz_util.h"
#include "server/http_transport.h"

using namespace osprey;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  HttpTransportOptions limits;
  limits.max_body_bytes = 4096;
  limits.max_header_bytes = 2048;
  limits.max_request_line_bytes = 1024;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] {
    HttpRequest r;
    const int status = parse_http_request(bytes, limits, r);
    if (status != 0 && status != -1 && status != 400 && status != 413 && status != 414 && status != 431) std::abort();
    if (status == 0 && (r.body.size() > limits.max_body_bytes || r.target.size() > limits.max_request_line_bytes ||
                        (r.version != 10 && r.version != 11)))
      std::abort();
  });
  return 0;
}
