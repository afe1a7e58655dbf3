#include "hub/hub_download.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "core/error.h"
#include "core/file_read.h"
#include "core/log.h"

namespace osprey::hub {
namespace fs = std::filesystem;

namespace {

// Error bodies are kept up to this many bytes for the message.
constexpr size_t kMaxErrorBody = 4096;
// Relative redirects a HEAD request follows (a renamed repository).
constexpr int kMaxRelativeRedirects = 5;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

std::string trim_space(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Percent-encodes everything but unreserved characters and those in `safe`.
std::string url_quote(const std::string& s, const std::string& safe) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || safe.find(char(c)) != std::string::npos) {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// huggingface_hub's _normalize_etag: no weak marker, no quotes.
std::string normalize_etag(std::string e) {
  e = trim_space(e);
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

// A file name from the API or an index stays inside the snapshot: relative, no "..", no
// empty or "." parts.
void check_repo_file_name(const std::string& f, const std::string& where) {
  bool bad = f.empty() || f.front() == '/' || f.find('\\') != std::string::npos || f.find('\0') != std::string::npos;
  size_t pos = 0;
  while (!bad && pos <= f.size()) {
    size_t slash = f.find('/', pos);
    std::string part = f.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    if (part.empty() || part == "." || part == "..") bad = true;
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  if (bad) throw InvalidInput(where + ": \"" + f + "\" is not a file name inside the repository");
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw IoError("libcurl failed to initialise");
  });
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// One transfer's state, shared with libcurl's callbacks.
struct Transfer {
  long status = 0;                            // of the latest response in a redirect chain
  std::map<std::string, std::string> headers;  // of that response, names in lower case
  std::string body;                           // a body that does not go to `sink`
  // When set, receives the body of a 200 or 206 response; false stops the transfer.
  std::function<bool(const char*, size_t)> sink;
  std::string sink_error;  // why the sink stopped it
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    t->headers.clear();
    size_t sp = line.find(' ');
    t->status = sp == std::string::npos ? 0 : std::strtol(line.c_str() + sp + 1, nullptr, 10);
  } else if (size_t colon = line.find(':'); colon != std::string::npos) {
    t->headers[lower(trim_space(line.substr(0, colon)))] = trim_space(line.substr(colon + 1));
  }
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (t->sink && (t->status == 200 || t->status == 206)) return t->sink(data, bytes) ? bytes : 0;
  if (t->body.size() < kMaxErrorBody) t->body.append(data, std::min(bytes, kMaxErrorBody - t->body.size()));
  return bytes;
}

struct Request {
  std::string url;
  bool head = false;
  bool follow_redirects = false;
  uint64_t range_from = 0;  // > 0: "Range: bytes=<range_from>-"
};

// Performs `r`; returns libcurl's result (the HTTP status is in `t`).
CURLcode perform(const Request& r, const ResolveOptions& o, Transfer& t, std::string& curl_message) {
  global_init();
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) throw IoError("libcurl failed to start a transfer for " + r.url);
  CURL* c = curl.get();
  std::unique_ptr<curl_slist, SlistDeleter> headers;
  auto add_header = [&](const std::string& h) {
    curl_slist* l = curl_slist_append(headers.get(), h.c_str());
    if (!l) throw OutOfMemory("libcurl: cannot add a request header");
    headers.release();
    headers.reset(l);
  };
  if (!o.token.empty()) add_header("Authorization: Bearer " + o.token);
  if (r.range_from > 0) add_header("Range: bytes=" + std::to_string(r.range_from) + "-");
  add_header("User-Agent: osprey");
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, r.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_NOBODY, r.head ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, r.follow_redirects ? 1L : 0L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, o.connect_timeout_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, o.stall_timeout_s);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  CURLcode rc = curl_easy_perform(c);
  curl_message = errbuf[0] ? errbuf : curl_easy_strerror(rc);
  return rc;
}

// What a failed request was after, for its error message.
struct Subject {
  const HubId& id;
  std::string file;  // empty: the repository or its revision
};

// Throws IoError for anything but 2xx and 3xx: 401/403 gated or private, 404 no such model,
// revision or file (the Hub's X-Error-Code says which, when it is sent), else the URL and
// status.
void check_status(const Transfer& t, const std::string& url, const Subject& s, const ResolveOptions& o) {
  if (t.status >= 200 && t.status < 400) return;
  const std::string code = t.headers.count("x-error-code") ? t.headers.at("x-error-code") : "";
  const std::string where = " (" + url + ": HTTP " + std::to_string(t.status) + ")";
  const std::string repo = s.id.repo();
  if (code == "RepoNotFound" || (t.status == 404 && code.empty() && s.file.empty()))
    throw IoError("no model " + repo + " on the Hub" +
                  (code.empty() && s.id.revision != "main" ? " (or no revision " + s.id.revision + " of it)" : "") +
                  where + (o.token.empty() ? "; if it is private, set HF_TOKEN" : ""));
  if (code == "RevisionNotFound") throw IoError("no revision " + s.id.revision + " of " + repo + " on the Hub" + where);
  if (code == "EntryNotFound" || t.status == 404)
    throw IoError("no file " + s.file + " in " + repo + " at revision " + s.id.revision + " on the Hub" + where);
  if (code == "GatedRepo" || t.status == 401 || t.status == 403)
    throw IoError(repo + " is gated or private" + where +
                  (o.token.empty() ? ": accept its terms on its Hub page and set HF_TOKEN to an access token"
                                   : ": the token in HF_TOKEN does not grant access to it (accept its terms on its "
                                     "Hub page, or use a token that can read it)"));
  std::string detail;
  nlohmann::json j = nlohmann::json::parse(t.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string()) detail = ": " + j["error"].get<std::string>();
  throw IoError("GET " + url + ": HTTP " + std::to_string(t.status) + detail);
}

[[noreturn]] void transfer_failed(const std::string& url, CURLcode rc, const std::string& message,
                                  const ResolveOptions& o) {
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY)
    throw IoError("cannot reach the Hub at " + o.endpoint + " (" + url + ": " + message +
                  "); check the network or HF_ENDPOINT, or use a model already in the cache");
  throw IoError(url + ": " + message);
}

// The commit a revision names and the repository's file names.
struct RepoInfo {
  std::string commit;
  std::vector<std::string> files;
};

RepoInfo fetch_repo_info(const HubId& id, const ResolveOptions& o) {
  const std::string url =
      o.endpoint + "/api/models/" + id.org + "/" + id.name + "/revision/" + url_quote(id.revision, "");
  Transfer t;
  std::string message;
  CURLcode rc = perform({url, false, true, 0}, o, t, message);
  if (rc != CURLE_OK) transfer_failed(url, rc, message, o);
  check_status(t, url, {id, ""}, o);
  nlohmann::json j = nlohmann::json::parse(t.body, nullptr, false);
  if (!j.is_object()) throw IoError(url + ": the response is not a JSON object");
  if (!j.contains("sha") || !j["sha"].is_string() || !is_commit_hash(j["sha"].get<std::string>()))
    throw IoError(url + ": \"sha\" is not a commit hash");
  if (!j.contains("siblings") || !j["siblings"].is_array()) throw IoError(url + ": no \"siblings\" list");
  RepoInfo info;
  info.commit = j["sha"].get<std::string>();
  for (const auto& s : j["siblings"]) {
    if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string())
      throw IoError(url + ": a sibling without a \"rfilename\" string");
    info.files.push_back(s["rfilename"].get<std::string>());
  }
  return info;
}

// What HEAD says of a file: its blob's name and its size (0 when unknown).
struct FileMeta {
  std::string etag;
  uint64_t size = 0;
};

FileMeta head_file(std::string url, const HubId& id, const std::string& file, const ResolveOptions& o) {
  for (int hop = 0;; ++hop) {
    Transfer t;
    std::string message;
    CURLcode rc = perform({url, true, false, 0}, o, t, message);
    if (rc != CURLE_OK) transfer_failed(url, rc, message, o);
    check_status(t, url, {id, file}, o);
    const std::string location = t.headers.count("location") ? t.headers.at("location") : "";
    if (t.status >= 300 && location.rfind("/", 0) == 0 && location.rfind("//", 0) != 0) {
      if (hop == kMaxRelativeRedirects) throw IoError(url + ": too many redirects");
      const size_t scheme = url.find("://");
      url = url.substr(0, url.find('/', scheme + 3)) + location;
      continue;
    }
    FileMeta m;
    auto header = [&](const char* name) { return t.headers.count(name) ? t.headers.at(name) : std::string(); };
    m.etag = normalize_etag(!header("x-linked-etag").empty() ? header("x-linked-etag") : header("etag"));
    if (m.etag.empty()) throw IoError(url + ": the response names no ETag, so the file has no blob name");
    if (m.etag.find('/') != std::string::npos || m.etag == "." || m.etag == "..")
      throw IoError(url + ": ETag \"" + m.etag + "\" cannot name a blob");
    const std::string size = !header("x-linked-size").empty() ? header("x-linked-size")
                             : t.status == 200                ? header("content-length")
                                                              : std::string();
    if (!size.empty()) m.size = std::strtoull(size.c_str(), nullptr, 10);
    return m;
  }
}

// An exclusive flock on `path`, as huggingface_hub's filelock takes on the same file.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(path.string() + ": cannot open the lock file");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      log_info("waiting for another download holding " + path.string());
      if (::flock(fd_, LOCK_EX) != 0) {
        ::close(fd_);
        throw IoError(path.string() + ": cannot lock");
      }
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

uint64_t file_size_or_zero(const fs::path& p) {
  std::error_code ec;
  uintmax_t n = fs::file_size(p, ec);
  return ec ? 0 : uint64_t(n);
}

// Downloads `url` into `blob` through `blob`.incomplete, resuming what that holds.
void fetch_blob(const std::string& url, const fs::path& blob, const FileMeta& meta, const std::string& file,
                const HubId& id, const ResolveOptions& o) {
  const fs::path partial = blob.string() + ".incomplete";
  std::string last_error;
  for (int attempt = 0; attempt < std::max(1, o.n_attempts); ++attempt) {
    uint64_t have = file_size_or_zero(partial);
    if (meta.size > 0 && have > meta.size) have = 0;  // not a prefix of this blob: start over
    if (meta.size > 0 && have == meta.size) break;
    if (have > 0) log_info("resuming " + file + " at byte " + std::to_string(have));
    Transfer t;
    std::unique_ptr<std::FILE, FileCloser> out;
    uint64_t done = have;
    t.sink = [&](const char* data, size_t n) {
      if (!out) {
        // A 206 continues the partial file; a 200 (the server ignored the range) replaces it.
        bool resume = t.status == 206;
        if (resume) {
          const std::string cr = t.headers.count("content-range") ? t.headers.at("content-range") : "";
          if (cr.rfind("bytes " + std::to_string(have) + "-", 0) != 0) {
            t.sink_error = "the server answered the range from byte " + std::to_string(have) + " with Content-Range \"" +
                           cr + "\"";
            return false;
          }
        } else {
          done = 0;
        }
        out.reset(std::fopen(partial.c_str(), resume ? "ab" : "wb"));
        if (!out) {
          t.sink_error = "cannot write " + partial.string();
          return false;
        }
      }
      if (std::fwrite(data, 1, n, out.get()) != n) {
        t.sink_error = "cannot write " + partial.string() + " (is the disk full?)";
        return false;
      }
      done += n;
      if (o.progress) o.progress(file, done, meta.size);
      return true;
    };
    std::string message;
    CURLcode rc = perform({url, false, true, have}, o, t, message);
    if (out && std::fflush(out.get()) != 0) throw IoError("cannot write " + partial.string() + " (is the disk full?)");
    out.reset();
    if (!t.sink_error.empty()) throw IoError(url + ": " + t.sink_error);
    if (rc == CURLE_OK && t.status == 416) {  // the partial file is no prefix the server knows
      fs::remove(partial);
      last_error = "HTTP 416 for the range from byte " + std::to_string(have);
      continue;
    }
    if (rc == CURLE_OK) check_status(t, url, {id, file}, o);
    if (rc == CURLE_OK && t.status != 200 && t.status != 206)
      throw IoError("GET " + url + ": HTTP " + std::to_string(t.status) + " where the file's bytes were expected");
    if (rc == CURLE_OK && (meta.size == 0 || file_size_or_zero(partial) == meta.size)) break;
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST) transfer_failed(url, rc, message, o);
    last_error = rc != CURLE_OK ? message
                                : "the transfer ended at byte " + std::to_string(file_size_or_zero(partial)) + " of " +
                                      std::to_string(meta.size);
    log_info(file + ": " + last_error + "; retrying");
    if (attempt + 1 == std::max(1, o.n_attempts))
      throw IoError(url + ": " + last_error + " (" + partial.string() + " is kept; the next try resumes it)");
  }
  const uint64_t got = file_size_or_zero(partial);
  if (!fs::exists(partial)) throw IoError(url + ": " + (last_error.empty() ? "nothing was received" : last_error));
  if (meta.size > 0 && got != meta.size)
    throw IoError(url + ": received " + std::to_string(got) + " bytes, the server announced " +
                  std::to_string(meta.size));
  fs::rename(partial, blob);
}

// snapshots/{commit}/{file} -> ../../blobs/{etag} (one more "../" per folder in `file`).
void link_snapshot_file(const fs::path& snapshot, const std::string& file, const std::string& etag) {
  const fs::path link = snapshot / file;
  fs::create_directories(link.parent_path());
  std::string target = "../../";
  for (char c : file)
    if (c == '/') target += "../";
  target += "blobs/" + etag;
  std::error_code ec;
  fs::remove(link, ec);
  fs::create_symlink(target, link);
}

void write_ref(const fs::path& repo, const std::string& revision, const std::string& commit) {
  const fs::path ref = repo / "refs" / revision;
  fs::create_directories(ref.parent_path());
  const fs::path tmp = ref.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << commit;
    if (!f.flush()) throw IoError("cannot write " + tmp.string());
  }
  fs::rename(tmp, ref);
}

void fetch_file(const HubId& id, const std::string& commit, const std::string& file, const ResolveOptions& o) {
  const fs::path repo = repo_cache_dir(o.cache_dir, id);
  const fs::path snapshot = repo / "snapshots" / commit;
  if (fs::exists(snapshot / file)) return;
  const std::string url = o.endpoint + "/" + id.org + "/" + id.name + "/resolve/" + commit + "/" + url_quote(file, "/");
  const FileMeta meta = head_file(url, id, file, o);
  const fs::path blob = repo / "blobs" / meta.etag;
  fs::create_directories(repo / "blobs");
  if (!fs::exists(blob)) {
    const fs::path locks = o.cache_dir / ".locks" / repo.filename();
    fs::create_directories(locks);
    FileLock lock(locks / (meta.etag + ".lock"));
    if (!fs::exists(blob)) {
      log_info("downloading " + id.repo() + "/" + file);
      fetch_blob(url, blob, meta, file, id, o);
    }
  }
  link_snapshot_file(snapshot, file, meta.etag);
}

}  // namespace

std::vector<std::string> files_to_fetch(const std::vector<std::string>& siblings, const std::string& repo) {
  const std::set<std::string> have(siblings.begin(), siblings.end());
  for (const char* f : {"config.json", "tokenizer.json"})
    if (!have.count(f)) throw InvalidInput(repo + " has no " + f + " on the Hub; Osprey needs it");
  std::vector<std::string> files;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "chat_template.jinja"})
    if (have.count(f)) files.push_back(f);
  if (have.count("model.safetensors")) {
    files.push_back("model.safetensors");
  } else if (have.count("model.safetensors.index.json")) {
    files.push_back("model.safetensors.index.json");
  } else {
    const bool gguf = std::any_of(siblings.begin(), siblings.end(), [](const std::string& s) {
      return s.size() > 5 && s.compare(s.size() - 5, 5, ".gguf") == 0;
    });
    std::string listed;
    for (const std::string& f : siblings)
      if (f.size() > 5 && f.compare(f.size() - 5, 5, ".gguf") == 0) listed += (listed.empty() ? "" : ", ") + f;
    throw InvalidInput(repo + " has no model.safetensors or model.safetensors.index.json on the Hub" +
                       (gguf ? ": it holds GGUF files; name one by its quantization, " + repo +
                                   ":Q4_K_M for instance (its GGUF files: " + listed + ")"
                             : std::string()));
  }
  return files;
}

namespace {

// download_model's work once the offline case is out of the way.
fs::path fetch_model(const HubId& id, const ResolveOptions& o) {
  const RepoInfo info = fetch_repo_info(id, o);
  const std::vector<std::string> files =
      id.quant.empty() ? files_to_fetch(info.files, id.repo()) : std::vector<std::string>{pick_gguf_file(info.files, id)};
  const fs::path repo = repo_cache_dir(o.cache_dir, id);
  const fs::path snapshot = repo / "snapshots" / info.commit;
  fs::create_directories(snapshot);
  if (!id.quant.empty()) check_repo_file_name(files[0], id.repo() + " (the Hub's file list)");
  log_info("fetching " + id.spec() + " (commit " + info.commit + ") into " + snapshot.string());
  for (const std::string& f : files) fetch_file(id, info.commit, f, o);
  if (std::find(files.begin(), files.end(), "model.safetensors.index.json") != files.end()) {
    const std::set<std::string> listed(info.files.begin(), info.files.end());
    const fs::path index = snapshot / "model.safetensors.index.json";
    for (const std::string& s : index_shards(read_safetensors_index(index))) {
      check_repo_file_name(s, index.string());
      if (!listed.count(s)) throw InvalidInput(index.string() + " names " + s + ", which " + id.repo() + " does not hold");
      fetch_file(id, info.commit, s, o);
    }
  }
  if (!is_commit_hash(id.revision)) write_ref(repo, id.revision, info.commit);
  return snapshot;
}

}  // namespace

fs::path download_model(const HubId& id, const ResolveOptions& o) {
  if (o.cache_dir.empty()) throw IoError("no Hugging Face cache folder to download into (set HF_HUB_CACHE or HF_HOME)");
  if (o.offline) {
    std::optional<fs::path> cached = find_cached_snapshot(o.cache_dir, id);
    if (cached && id.quant.empty() && missing_model_files(*cached).empty()) return *cached;
    throw IoError("HF_HUB_OFFLINE is set, and " + id.spec() + " is not (wholly) in the Hugging Face cache (" +
                  o.cache_dir.string() + "): unset HF_HUB_OFFLINE to download it");
  }
  try {
    return fetch_model(id, o);
  } catch (const fs::filesystem_error& e) {
    throw IoError(std::string("the Hugging Face cache: ") + e.what());
  }
}

}  // namespace osprey::hub
