#include "server/webui.h"

#include <zlib.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"
#include "server/api_error.h"

// The embedded page: webui/prebuilt/index.html.gz as bytes (cmake/embed_file.cmake).
extern "C" const unsigned char osprey_webui_index_html_gz[];
extern "C" const unsigned long osprey_webui_index_html_gz_size;

namespace osprey {
namespace fs = std::filesystem;
namespace {

// One representation of a file: its bytes in either coding and their ETags.
struct Asset {
  std::string identity, gzip;
  std::string etag, gzip_etag;
  std::string content_type;
};

// FNV-1a, 64 bits: ETags only need to change when the bytes do.
std::string etag_of(const std::string& bytes, const char* suffix) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "\"%016llx%s\"", (unsigned long long)h, suffix);
  return buf;
}

const Asset& embedded_page() {
  static const Asset page = [] {
    Asset a;
    a.gzip.assign(reinterpret_cast<const char*>(osprey_webui_index_html_gz), osprey_webui_index_html_gz_size);
    a.identity = gunzip(a.gzip);
    a.etag = etag_of(a.gzip, "");
    a.gzip_etag = etag_of(a.gzip, "-gzip");
    a.content_type = "text/html; charset=utf-8";
    return a;
  }();
  return page;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = char(std::tolower((unsigned char)c));
  return s;
}

std::string trim_blanks(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim_blanks(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Whether Accept-Encoding (RFC 9110 12.5.3) allows gzip: "gzip", "x-gzip" or "*" with a
// non-zero q. An explicit "gzip;q=0" wins over "*".
bool accepts_gzip(const std::string& header) {
  bool star = false, gzip = false, gzip_named = false;
  for (const std::string& item : split_commas(ascii_lower(header))) {
    const size_t semi = item.find(';');
    const std::string coding = trim_blanks(item.substr(0, semi));
    bool allowed = true;
    if (semi != std::string::npos) {
      const std::string param = trim_blanks(item.substr(semi + 1));
      if (param.rfind("q=", 0) == 0) allowed = std::strtod(param.c_str() + 2, nullptr) > 0;
    }
    if (coding == "gzip" || coding == "x-gzip") {
      gzip_named = true;
      gzip = gzip || allowed;
    } else if (coding == "*") {
      star = allowed;
    }
  }
  return gzip_named ? gzip : star;
}

// Whether If-None-Match names one of the asset's ETags (weak comparison, RFC 9110 13.1.2).
bool etag_matches(const std::string& header, const Asset& a) {
  for (std::string tag : split_commas(header)) {
    if (tag == "*") return true;
    if (tag.rfind("W/", 0) == 0) tag = tag.substr(2);
    if (tag == a.etag || tag == a.gzip_etag) return true;
  }
  return false;
}

// The server's error object; 404s are "not_found_error" like its other unknown routes.
WebUiResponse error_response(int status, const std::string& message) {
  ApiError e;
  e.status = status;
  e.type = status == 404 ? "not_found_error" : "invalid_request_error";
  e.message = message;
  WebUiResponse r;
  r.status = status;
  r.headers = {{"Content-Type", "application/json"}};
  r.body = e.body().dump();
  return r;
}

// The path of a request-target: the query dropped, %XX escapes decoded. False when an escape
// is malformed or decodes to a NUL, or the path does not start with '/'.
bool decode_path(const std::string& target, std::string& path) {
  const std::string raw = target.substr(0, target.find_first_of("?#"));
  path.clear();
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '%') {
      path += raw[i];
      continue;
    }
    if (i + 2 >= raw.size() || !std::isxdigit((unsigned char)raw[i + 1]) || !std::isxdigit((unsigned char)raw[i + 2]))
      return false;
    const char c = char(std::stoi(raw.substr(i + 1, 2), nullptr, 16));
    if (c == '\0') return false;
    path += c;
    i += 2;
  }
  return !path.empty() && path[0] == '/';
}

std::string content_type_of(const fs::path& file) {
  static const std::pair<const char*, const char*> types[] = {
      {".html", "text/html; charset=utf-8"},  {".htm", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"}, {".mjs", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},    {".json", "application/json"},
      {".map", "application/json"},           {".txt", "text/plain; charset=utf-8"},
      {".svg", "image/svg+xml"},              {".png", "image/png"},
      {".jpg", "image/jpeg"},                 {".jpeg", "image/jpeg"},
      {".gif", "image/gif"},                  {".webp", "image/webp"},
      {".ico", "image/x-icon"},               {".wasm", "application/wasm"},
      {".woff", "font/woff"},                 {".woff2", "font/woff2"},
  };
  const std::string ext = ascii_lower(file.extension().string());
  for (const auto& [e, type] : types)
    if (ext == e) return type;
  return "application/octet-stream";
}

bool compressible(const std::string& content_type) {
  return content_type.rfind("text/", 0) == 0 || content_type == "application/json" ||
         content_type == "image/svg+xml" || content_type == "application/wasm";
}

// The file under `root` that a decoded path names, or "" when it names none (a missing file,
// a folder, or a path with "." or ".." segments or a backslash).
fs::path file_under(const fs::path& root, const std::string& path) {
  std::string rel = path.substr(1);
  if (rel.empty()) rel = "index.html";
  if (rel.find('\\') != std::string::npos) return {};
  std::stringstream ss(rel);
  std::string segment;
  while (std::getline(ss, segment, '/'))
    if (segment.empty() || segment == "." || segment == "..") return {};
  if (rel.back() == '/') return {};
  const fs::path file = root / rel;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return {};
  return file;
}

}  // namespace

std::string gzip_compress(const std::string& data) {
  z_stream z{};
  // windowBits 15 + 16: a gzip header and trailer instead of zlib's.
  if (deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK)
    throw OutOfMemory("gzip: deflateInit2 failed");
  std::string out(deflateBound(&z, uLong(data.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = uInt(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw InvalidInput("gzip: deflate did not finish");
  return out;
}

std::string gunzip(const std::string& data) {
  z_stream z{};
  if (inflateInit2(&z, 16 + 15) != Z_OK) throw OutOfMemory("gunzip: inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = uInt(data.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) throw InvalidInput("gunzip: the data is not a complete gzip stream");
  return out;
}

void check_webui_options(const WebUiOptions& options) {
  if (!options.enabled || options.dir.empty()) return;
  std::error_code ec;
  if (!fs::is_directory(options.dir, ec))
    throw InvalidInput("--webui-dir " + options.dir.string() + " is not a folder");
  if (!fs::is_regular_file(options.dir / "index.html", ec))
    throw InvalidInput("--webui-dir " + options.dir.string() + " has no index.html");
}

bool is_webui_target(const std::string& target, const WebUiOptions& options) {
  std::string path;
  if (!options.enabled || !decode_path(target, path)) return false;
  if (path == "/" || path == "/index.html") return true;
  // A file name with an extension: the API's routes have none.
  return !options.dir.empty() && path.substr(path.rfind('/') + 1).find('.') != std::string::npos;
}

WebUiResponse serve_webui(const WebUiRequest& request, const WebUiOptions& options) {
  std::string path;
  if (!options.enabled)
    return error_response(404, "no route " + request.method + " " + request.target + " (the chat page is off: --no-webui)");
  if (request.method != "GET" && request.method != "HEAD") {
    WebUiResponse r = error_response(405, "method " + request.method + " is not allowed on " + request.target);
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  if (!decode_path(request.target, path)) return error_response(400, "malformed request path " + request.target);

  Asset file;
  const Asset* asset = nullptr;
  if (options.dir.empty()) {
    if (path == "/" || path == "/index.html") asset = &embedded_page();
  } else {
    const fs::path f = file_under(options.dir, path);
    if (!f.empty()) {
      std::ifstream in(f, std::ios::binary);
      if (!in) return error_response(404, "cannot read " + path + " from --webui-dir");
      file.identity.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      file.content_type = content_type_of(f);
      file.etag = etag_of(file.identity, "");
      file.gzip_etag = etag_of(file.identity, "-gzip");
      asset = &file;
    }
  }
  if (!asset) return error_response(404, "no route " + request.method + " " + path);

  const bool gzip = accepts_gzip(request.accept_encoding) && (asset == &file ? compressible(file.content_type) : true);
  WebUiResponse r;
  r.headers = {{"ETag", gzip ? asset->gzip_etag : asset->etag},
               {"Cache-Control", "no-cache"},
               {"Vary", "Accept-Encoding"},
               {"X-Content-Type-Options", "nosniff"}};
  if (etag_matches(request.if_none_match, *asset)) {
    r.status = 304;
    return r;
  }
  r.headers.emplace_back("Content-Type", asset->content_type);
  if (gzip) {
    r.headers.emplace_back("Content-Encoding", "gzip");
    r.body = asset == &file ? gzip_compress(file.identity) : asset->gzip;
  } else {
    r.body = asset->identity;
  }
  return r;
}

}  // namespace osprey
