#pragma once
// The chat page `osprey serve` answers GET / with (docs/server.md, "The chat page"). The page is
// one gzip-compressed HTML file embedded in the binary (webui/prebuilt/index.html.gz, rebuilt by
// scripts/build-webui.sh); --webui-dir serves a folder in its place and --no-webui turns it off.
//
// This module knows no HTTP library: the transport hands it the request line's method and
// target and two request headers, and writes back the status, headers and body it returns.
// Thread-safe.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace osprey {

struct WebUiOptions {
  bool enabled = true;          // false (--no-webui): every path answers 404
  std::filesystem::path dir;    // non-empty (--webui-dir): serve this folder instead of the embedded page
};

struct WebUiRequest {
  std::string method;           // "GET" or "HEAD"; anything else answers 405
  std::string target;           // the request-target as sent: percent-encoded path, maybe "?query"
  std::string if_none_match;    // the If-None-Match header ("" when absent)
  std::string accept_encoding;  // the Accept-Encoding header ("" when absent)
};

struct WebUiResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // Content-Type, ETag, Content-Encoding, ...
  std::string body;  // empty for 304; for HEAD the transport sends the headers only
};

// Throws InvalidInput when options.dir is set but is not a folder holding index.html
// (naming --webui-dir); call it once at start-up.
void check_webui_options(const WebUiOptions& options);

// The answer to one request. "/" (and "/index.html") is the page; with --webui-dir any file
// under the folder is served by its extension's content type, and paths that leave the folder
// answer 404. Bodies are gzip-encoded when Accept-Encoding allows it, with "Vary:
// Accept-Encoding"; an If-None-Match naming the current ETag answers 304 without a body.
// Errors (404, 405) carry an OpenAI error object as JSON.
WebUiResponse serve_webui(const WebUiRequest& request, const WebUiOptions& options);

// Whether a GET of this target is the page or one of its files: such requests need no API key
// (the page asks for the key itself).
bool is_webui_target(const std::string& target, const WebUiOptions& options);

// gzip (RFC 1952) encoding and decoding through zlib. gunzip throws InvalidInput on a corrupt
// stream.
std::string gzip_compress(const std::string& data);
std::string gunzip(const std::string& data);

}  // namespace osprey
