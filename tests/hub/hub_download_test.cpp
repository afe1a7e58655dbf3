// Fetching models from a loopback server that speaks the Hub's URL and header layout: the
// revision API, /resolve/ answering LFS files with a 302 to a blob URL carrying
// X-Linked-Etag and X-Linked-Size (other files: 200 with an ETag), Range requests (206), 401
// for a gated model without a token, 404 with the Hub's X-Error-Code.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "hub/hub_cache.h"
#include "hub/hub_download.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using hub::HubId;
using hub::ResolveOptions;
using testing::TempDir;

const std::string kCommit = "c0ffee0000000000000000000000000000000001";
const std::string kDevCommit = "c0ffee0000000000000000000000000000000002";

struct FakeFile {
  std::string bytes;
  std::string etag;  // the blob name the client must use
  bool lfs = false;  // served as the Hub serves LFS files: a 302 to /blobs/<etag>
};

struct FakeRepo {
  std::map<std::string, std::string> revisions;  // revision -> commit
  std::map<std::string, FakeFile> files;         // the same files at every commit
  bool gated = false;                            // needs "Authorization: Bearer <kToken>"
  std::set<std::string> vanished;                // listed, but /resolve/ answers 404
};

constexpr const char* kToken = "hf_test_token";

struct SeenRequest {
  std::string method, path, range, authorization;
};

// The Hub's URL layout on 127.0.0.1 at an ephemeral port.
class FakeHub {
 public:
  FakeHub() {
    server_.Get(R"(/api/models/([^/]+)/([^/]+)/revision/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      const FakeRepo* repo = find(req.matches[1].str() + "/" + req.matches[2].str(), req, res);
      if (!repo) return;
      auto rev = repo->revisions.find(req.matches[3].str());
      if (rev == repo->revisions.end()) {
        res.status = 404;
        res.set_header("X-Error-Code", "RevisionNotFound");
        res.set_content(R"({"error":"Invalid rev id"})", "application/json");
        return;
      }
      nlohmann::json siblings = nlohmann::json::array();
      for (const auto& [name, f] : repo->files) siblings.push_back({{"rfilename", name}});
      res.set_content(nlohmann::json{{"id", req.matches[1].str() + "/" + req.matches[2].str()},
                                     {"sha", rev->second},
                                     {"siblings", siblings}}
                          .dump(),
                      "application/json");
    });
    server_.Get(R"(/([^/]+)/([^/]+)/resolve/([0-9a-f]{40})/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      const FakeRepo* repo = find(req.matches[1].str() + "/" + req.matches[2].str(), req, res);
      if (!repo) return;
      auto f = repo->files.find(req.matches[4].str());
      if (f == repo->files.end() || repo->vanished.count(f->first)) {
        res.status = 404;
        res.set_header("X-Error-Code", "EntryNotFound");
        return;
      }
      if (f->second.lfs) {
        res.status = 302;
        res.set_header("Location", "http://127.0.0.1:" + std::to_string(port_) + "/blobs/" + f->second.etag);
        res.set_header("X-Linked-Etag", "\"" + f->second.etag + "\"");
        res.set_header("X-Linked-Size", std::to_string(f->second.bytes.size()));
        res.set_header("ETag", "\"the-pointer-file-not-the-blob\"");
        return;
      }
      res.set_header("ETag", "\"" + f->second.etag + "\"");
      res.set_content(f->second.bytes, "application/octet-stream");
    });
    server_.Get(R"(/blobs/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      const std::string etag = req.matches[1].str();
      std::string bytes;
      size_t cut = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& [id, repo] : repos_)
          for (const auto& [name, f] : repo.files)
            if (f.etag == etag) bytes = f.bytes;
        if (auto t = truncate_once_.find(etag); t != truncate_once_.end()) {
          cut = t->second;
          truncate_once_.erase(t);
        }
      }
      if (bytes.empty()) {
        res.status = 404;
        return;
      }
      // httplib answers a Range header with 206 and the slice of what the provider gives.
      res.set_content_provider(bytes.size(), "application/octet-stream",
                               [bytes, cut](size_t offset, size_t length, httplib::DataSink& sink) {
                                 if (cut > 0) {  // the connection drops after `cut` bytes
                                   sink.write(bytes.data() + offset, std::min(length, cut));
                                   return false;
                                 }
                                 sink.write(bytes.data() + offset, length);
                                 return true;
                               });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 5000 && !server_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeHub() {
    server_.stop();
    thread_.join();
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void add(const std::string& id, FakeRepo repo) {
    std::lock_guard<std::mutex> lock(mutex_);
    repos_[id] = std::move(repo);
  }
  // The next GET of blob `etag` ends after `bytes` bytes.
  void truncate_once(const std::string& etag, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    truncate_once_[etag] = bytes;
  }
  std::vector<SeenRequest> seen() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return seen_;
  }
  std::vector<SeenRequest> seen_path(const std::string& path) const {
    std::vector<SeenRequest> out;
    for (const SeenRequest& r : seen())
      if (r.path == path) out.push_back(r);
    return out;
  }

 private:
  void record(const httplib::Request& req) {
    std::lock_guard<std::mutex> lock(mutex_);
    seen_.push_back({req.method, req.path, req.get_header_value("Range"), req.get_header_value("Authorization")});
  }
  // The repo, or nullptr with the response set: 404 when unknown, 401 when gated and the
  // token is missing or wrong.
  const FakeRepo* find(const std::string& id, const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = repos_.find(id);
    if (it == repos_.end()) {
      res.status = 404;
      res.set_content(R"({"error":"Repository not found"})", "application/json");
      return nullptr;
    }
    if (it->second.gated && req.get_header_value("Authorization") != std::string("Bearer ") + kToken) {
      res.status = 401;
      res.set_content(R"({"error":"Access to model )" + id + R"( is restricted."})", "application/json");
      return nullptr;
    }
    return &it->second;
  }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  mutable std::mutex mutex_;
  std::map<std::string, FakeRepo> repos_;
  std::map<std::string, size_t> truncate_once_;
  std::vector<SeenRequest> seen_;
};

// Bytes that differ at every position, so that a misplaced slice shows.
std::string pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = char(x >> 24);
  }
  return s;
}

// A tiny model repository: small git files with sha1-like etags, LFS weights with a
// sha256-like etag, and files a run does not need.
FakeRepo tiny_repo() {
  FakeRepo r;
  r.revisions = {{"main", kCommit}, {"dev", kDevCommit}};
  r.files["config.json"] = {R"({"model_type":"llama"})", "1111111111111111111111111111111111111111", false};
  r.files["generation_config.json"] = {R"({"eos_token_id":2})", "2222222222222222222222222222222222222222", false};
  r.files["tokenizer.json"] = {R"({"model":{}})", "3333333333333333333333333333333333333333", false};
  r.files["tokenizer_config.json"] = {R"({"bos_token":"<s>"})", "4444444444444444444444444444444444444444", false};
  r.files["model.safetensors"] = {pattern(300000, 7),
                                  "5555555555555555555555555555555555555555555555555555555555555555", true};
  r.files["README.md"] = {"# tiny", "6666666666666666666666666666666666666666", false};
  r.files["pytorch_model.bin"] = {pattern(1000, 8), "7777777777777777777777777777777777777777777777777777777777777777",
                                  true};
  r.files["model-q4.gguf"] = {pattern(1000, 9), "8888888888888888888888888888888888888888888888888888888888888888",
                              true};
  return r;
}

// A hub serving tiny_repo() as org/tiny, and that repo's weights.
struct TinyHub {
  FakeHub server;
  const FakeRepo repo = tiny_repo();
  const FakeFile& weights = repo.files.at("model.safetensors");
  TinyHub() { server.add("org/tiny", repo); }
};

ResolveOptions options_for(const fs::path& cache, const FakeHub& hub) {
  ResolveOptions o;
  o.cache_dir = cache;
  o.endpoint = hub.endpoint();
  o.connect_timeout_s = 5;
  o.stall_timeout_s = 10;
  return o;
}

HubId id_of(const std::string& spec) { return *hub::parse_hub_id(spec); }

std::string message_of(const std::function<void()>& f) { return testing::error_of(f, "(no error)"); }

// A loopback port with nothing listening: bound, never listened on, closed.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("closed_port: no loopback socket");
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

TEST(HubDownload, PullWritesHuggingFaceHubsCacheLayout) {
  FakeHub server;
  const FakeRepo repo = tiny_repo();
  server.add("org/tiny", repo);
  TempDir cache;
  const fs::path snapshot = hub::download_model(id_of("org/tiny"), options_for(cache.path(), server));
  const fs::path dir = cache / "models--org--tiny";
  EXPECT_EQ(snapshot, dir / "snapshots" / kCommit);
  EXPECT_EQ(testing::read_file(dir / "refs" / "main"), kCommit);
  EXPECT_FALSE(fs::exists(dir / "refs" / "dev"));
  for (const char* name :
       {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"}) {
    const FakeFile& f = repo.files.at(name);
    const fs::path link = snapshot / name;
    ASSERT_TRUE(fs::is_symlink(link)) << name;
    EXPECT_EQ(fs::read_symlink(link), fs::path("../../blobs/" + f.etag)) << name;
    EXPECT_EQ(testing::read_file(dir / "blobs" / f.etag), f.bytes) << name;
  }
  // Only what a run reads; nothing left half-written.
  for (const char* name : {"README.md", "pytorch_model.bin", "model-q4.gguf"}) EXPECT_FALSE(fs::exists(snapshot / name));
  size_t n_blobs = 0;
  for (const auto& e : fs::directory_iterator(dir / "blobs")) {
    EXPECT_EQ(e.path().extension(), "") << e.path();
    ++n_blobs;
  }
  EXPECT_EQ(n_blobs, 5u);
  for (const SeenRequest& r : server.seen()) {
    EXPECT_EQ(r.path.find("README"), std::string::npos) << r.path;
    EXPECT_EQ(r.path.find("pytorch_model"), std::string::npos) << r.path;
    EXPECT_EQ(r.authorization, "") << "no token was set";
  }
  // The LFS file was fetched through its 302 from /blobs/.
  EXPECT_EQ(server.seen_path("/blobs/" + repo.files.at("model.safetensors").etag).size(), 1u);
  // A second pull fetches nothing again but the revision.
  const size_t before = server.seen().size();
  hub::download_model(id_of("org/tiny"), options_for(cache.path(), server));
  const auto after = server.seen();
  ASSERT_EQ(after.size(), before + 1);
  EXPECT_EQ(after.back().path, "/api/models/org/tiny/revision/main");
  // And -m finds it with no server at all.
  ResolveOptions offline = options_for(cache.path(), server);
  offline.endpoint = "http://127.0.0.1:" + std::to_string(closed_port());
  EXPECT_EQ(hub::resolve_model("org/tiny", offline), snapshot.string());
}

TEST(HubDownload, ABranchWritesItsRefAndACommitWritesNone) {
  FakeHub server;
  server.add("org/tiny", tiny_repo());
  TempDir cache;
  const fs::path dir = cache / "models--org--tiny";
  EXPECT_EQ(hub::download_model(id_of("org/tiny:dev"), options_for(cache.path(), server)),
            dir / "snapshots" / kDevCommit);
  EXPECT_EQ(testing::read_file(dir / "refs" / "dev"), kDevCommit);
  EXPECT_FALSE(fs::exists(dir / "refs" / "main"));
  // The blobs are shared by content: the second commit links the same ones.
  FakeRepo by_commit = tiny_repo();
  by_commit.revisions[kCommit] = kCommit;
  server.add("org/tiny", by_commit);
  EXPECT_EQ(hub::download_model(id_of("org/tiny:" + kCommit), options_for(cache.path(), server)),
            dir / "snapshots" / kCommit);
  EXPECT_FALSE(fs::exists(dir / "refs" / kCommit));
  EXPECT_FALSE(fs::exists(dir / "refs" / "main"));
  EXPECT_EQ(server.seen_path("/blobs/5555555555555555555555555555555555555555555555555555555555555555").size(), 1u);
}

TEST(HubDownload, ShardedWeightsFetchTheIndexAndTheShardsItNames) {
  FakeHub server;
  FakeRepo repo = tiny_repo();
  repo.files.erase("model.safetensors");
  repo.files["model.safetensors.index.json"] = {
      R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors",
          "c":"model-00001-of-00002.safetensors"}})",
      "9999999999999999999999999999999999999999", false};
  repo.files["model-00001-of-00002.safetensors"] = {pattern(5000, 1), std::string(64, 'a'), true};
  repo.files["model-00002-of-00002.safetensors"] = {pattern(7000, 2), std::string(64, 'b'), true};
  repo.files["consolidated.safetensors"] = {pattern(100, 3), std::string(64, 'c'), true};
  server.add("org/sharded", repo);
  TempDir cache;
  const fs::path snapshot = hub::download_model(id_of("org/sharded"), options_for(cache.path(), server));
  for (const char* name : {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"})
    EXPECT_EQ(testing::read_file(snapshot / name), repo.files.at(name).bytes) << name;
  EXPECT_FALSE(fs::exists(snapshot / "consolidated.safetensors"));
  EXPECT_TRUE(hub::missing_model_files(snapshot).empty());
}

TEST(HubDownload, AnInterruptedTransferResumesWithARange) {
  TinyHub tiny;
  tiny.server.truncate_once(tiny.weights.etag, 100000);
  TempDir cache;
  const fs::path snapshot = hub::download_model(id_of("org/tiny"), options_for(cache.path(), tiny.server));
  const auto gets = tiny.server.seen_path("/blobs/" + tiny.weights.etag);
  ASSERT_EQ(gets.size(), 2u);
  EXPECT_EQ(gets[0].range, "");
  EXPECT_EQ(gets[1].range, "bytes=100000-");
  EXPECT_EQ(testing::read_file(snapshot / "model.safetensors"), tiny.weights.bytes);
  EXPECT_FALSE(fs::exists(cache / "models--org--tiny" / "blobs" / (tiny.weights.etag + ".incomplete")));
}

TEST(HubDownload, APartialFileFromAnEarlierRunIsResumed) {
  TinyHub tiny;
  TempDir cache;
  const fs::path blobs = cache / "models--org--tiny" / "blobs";
  fs::create_directories(blobs);
  testing::write_file(blobs / (tiny.weights.etag + ".incomplete"), tiny.weights.bytes.substr(0, 123457));
  const fs::path snapshot = hub::download_model(id_of("org/tiny"), options_for(cache.path(), tiny.server));
  const auto gets = tiny.server.seen_path("/blobs/" + tiny.weights.etag);
  ASSERT_EQ(gets.size(), 1u);
  EXPECT_EQ(gets[0].range, "bytes=123457-");
  EXPECT_EQ(testing::read_file(blobs / tiny.weights.etag), tiny.weights.bytes);
  EXPECT_EQ(testing::read_file(snapshot / "model.safetensors"), tiny.weights.bytes);
  EXPECT_FALSE(fs::exists(blobs / (tiny.weights.etag + ".incomplete")));
}

TEST(HubDownload, TransfersThatKeepFailingLeaveThePartialFile) {
  TinyHub tiny;
  tiny.server.truncate_once(tiny.weights.etag, 1000);
  TempDir cache;
  ResolveOptions o = options_for(cache.path(), tiny.server);
  o.n_attempts = 1;
  const std::string m = message_of([&] { hub::download_model(id_of("org/tiny"), o); });
  EXPECT_NE(m.find("/resolve/" + kCommit + "/model.safetensors"), std::string::npos) << m;
  EXPECT_NE(m.find(".incomplete is kept"), std::string::npos) << m;
  const fs::path partial = cache / "models--org--tiny" / "blobs" / (tiny.weights.etag + ".incomplete");
  EXPECT_EQ(testing::read_file(partial), tiny.weights.bytes.substr(0, 1000));
  // No ref and no link to a blob that is not whole.
  EXPECT_FALSE(fs::exists(cache / "models--org--tiny" / "refs" / "main"));
  EXPECT_FALSE(fs::exists(cache / "models--org--tiny" / "snapshots" / kCommit / "model.safetensors"));
  // The next run resumes at byte 1000.
  hub::download_model(id_of("org/tiny"), options_for(cache.path(), tiny.server));
  EXPECT_EQ(tiny.server.seen_path("/blobs/" + tiny.weights.etag).back().range, "bytes=1000-");
  EXPECT_EQ(testing::read_file(cache / "models--org--tiny" / "blobs" / tiny.weights.etag), tiny.weights.bytes);
}

TEST(HubDownload, AGatedModelNeedsHfToken) {
  FakeHub server;
  FakeRepo repo = tiny_repo();
  repo.gated = true;
  server.add("org/gated", repo);
  TempDir cache;
  ResolveOptions o = options_for(cache.path(), server);
  std::string m = message_of([&] { hub::download_model(id_of("org/gated"), o); });
  EXPECT_NE(m.find("org/gated is gated or private"), std::string::npos) << m;
  EXPECT_NE(m.find("set HF_TOKEN"), std::string::npos) << m;
  EXPECT_NE(m.find("HTTP 401"), std::string::npos) << m;
  o.token = "hf_wrong";
  m = message_of([&] { hub::download_model(id_of("org/gated"), o); });
  EXPECT_NE(m.find("does not grant access"), std::string::npos) << m;
  o.token = kToken;
  const size_t before = server.seen().size();
  const fs::path snapshot = hub::download_model(id_of("org/gated"), o);
  EXPECT_EQ(testing::read_file(snapshot / "config.json"), repo.files.at("config.json").bytes);
  const auto seen = server.seen();
  ASSERT_GT(seen.size(), before);
  for (size_t i = before; i < seen.size(); ++i)
    EXPECT_EQ(seen[i].authorization, std::string("Bearer ") + kToken) << seen[i].method << " " << seen[i].path;
}

TEST(HubDownload, NotFoundNamesTheModelTheRevisionOrTheFile) {
  FakeHub server;
  FakeRepo repo = tiny_repo();
  server.add("org/tiny", repo);
  TempDir cache;
  const ResolveOptions o = options_for(cache.path(), server);
  std::string m = message_of([&] { hub::download_model(id_of("org/absent"), o); });
  EXPECT_NE(m.find("no model org/absent on the Hub"), std::string::npos) << m;
  EXPECT_NE(m.find("HTTP 404"), std::string::npos) << m;
  m = message_of([&] { hub::download_model(id_of("org/tiny:v9"), o); });
  EXPECT_NE(m.find("no revision v9 of org/tiny"), std::string::npos) << m;
  // The listing names a file the server then does not have.
  repo.vanished.insert("tokenizer_config.json");
  server.add("org/tiny", repo);
  m = message_of([&] { hub::download_model(id_of("org/tiny"), o); });
  EXPECT_NE(m.find("no file tokenizer_config.json in org/tiny at revision main"), std::string::npos) << m;
  EXPECT_NE(m.find("/org/tiny/resolve/" + kCommit + "/tokenizer_config.json: HTTP 404"), std::string::npos) << m;
}

TEST(HubDownload, AGgufOnlyOrTokenizerlessRepositoryIsNamed) {
  FakeHub server;
  FakeRepo gguf = tiny_repo();
  gguf.files.erase("model.safetensors");
  server.add("org/tiny-GGUF", gguf);
  FakeRepo no_tokenizer = tiny_repo();
  no_tokenizer.files.erase("tokenizer.json");
  server.add("org/sp", no_tokenizer);
  TempDir cache;
  const ResolveOptions o = options_for(cache.path(), server);
  std::string m = message_of([&] { hub::download_model(id_of("org/tiny-GGUF"), o); });
  EXPECT_NE(m.find("it holds GGUF files; name one by its quantization, org/tiny-GGUF:Q4_K_M for instance (its GGUF "
                   "files: model-q4.gguf)"),
            std::string::npos)
      << m;
  m = message_of([&] { hub::download_model(id_of("org/sp"), o); });
  EXPECT_NE(m.find("org/sp has no tokenizer.json"), std::string::npos) << m;
}

TEST(HubDownload, AGgufTagFetchesThatOneFile) {
  FakeHub server;
  FakeRepo repo;
  repo.revisions = {{"main", kCommit}};
  repo.files["tiny-Q4_K_M.gguf"] = {pattern(5000, 3), "9999999999999999999999999999999999999999999999999999999999999999",
                                    true};
  repo.files["tiny-Q8_0.gguf"] = {pattern(7000, 4), "aaaa999999999999999999999999999999999999999999999999999999999999",
                                  true};
  repo.files["README.md"] = {"# tiny", "6666666666666666666666666666666666666666", false};
  server.add("org/tiny-GGUF", repo);
  TempDir cache;
  ResolveOptions o = options_for(cache.path(), server);
  o.download = true;
  const std::string file = hub::resolve_model("org/tiny-GGUF:q4_k_m", o);
  const fs::path snapshot = cache / "models--org--tiny-GGUF" / "snapshots" / kCommit;
  EXPECT_EQ(file, (snapshot / "tiny-Q4_K_M.gguf").string());
  EXPECT_EQ(testing::read_file(file), repo.files.at("tiny-Q4_K_M.gguf").bytes);
  EXPECT_FALSE(fs::exists(snapshot / "tiny-Q8_0.gguf"));
  EXPECT_FALSE(fs::exists(snapshot / "README.md"));
  EXPECT_EQ(testing::read_file(cache / "models--org--tiny-GGUF" / "refs" / "main"), kCommit);
  // Then from the cache alone; a tag the repository lacks names its files.
  ResolveOptions offline = options_for(cache.path(), server);
  offline.endpoint = "http://127.0.0.1:" + std::to_string(closed_port());
  EXPECT_EQ(hub::resolve_model("org/tiny-GGUF:Q4_K_M", offline), file);
  const std::string m = message_of([&] { hub::download_model(id_of("org/tiny-GGUF:Q5_K_M"), o); });
  EXPECT_NE(m.find("no GGUF file of org/tiny-GGUF is tagged Q5_K_M (its GGUF files: tiny-Q4_K_M.gguf, tiny-Q8_0.gguf)"),
            std::string::npos)
      << m;
}

TEST(HubDownload, AnIndexNamingAFileOutsideTheRepositoryIsRefused) {
  FakeHub server;
  FakeRepo repo = tiny_repo();
  repo.files.erase("model.safetensors");
  repo.files["model.safetensors.index.json"] = {R"({"weight_map":{"a":"../../../escape.safetensors"}})",
                                                "9999999999999999999999999999999999999999", false};
  server.add("org/evil", repo);
  TempDir cache;
  const std::string m = message_of([&] { hub::download_model(id_of("org/evil"), options_for(cache.path(), server)); });
  EXPECT_NE(m.find("../../../escape.safetensors"), std::string::npos) << m;
  EXPECT_TRUE(server.seen_path("/org/evil/resolve/" + kCommit + "/../../../escape.safetensors").empty());
  EXPECT_FALSE(fs::exists(cache / "escape.safetensors"));
}

TEST(HubDownload, OfflineOrUnreachableIsAClearError) {
  FakeHub server;
  server.add("org/tiny", tiny_repo());
  TempDir cache;
  ResolveOptions o = options_for(cache.path(), server);
  o.offline = true;
  std::string m = message_of([&] { hub::download_model(id_of("org/tiny"), o); });
  EXPECT_NE(m.find("HF_HUB_OFFLINE"), std::string::npos) << m;
  EXPECT_NE(m.find("org/tiny"), std::string::npos) << m;
  o.download = true;
  m = message_of([&] { hub::resolve_model("org/tiny", o); });
  EXPECT_NE(m.find("HF_HUB_OFFLINE"), std::string::npos) << m;
  EXPECT_TRUE(server.seen().empty());
  o.offline = false;
  o.endpoint = "http://127.0.0.1:" + std::to_string(closed_port());
  const auto t0 = std::chrono::steady_clock::now();
  m = message_of([&] { hub::download_model(id_of("org/tiny"), o); });
  EXPECT_NE(m.find("cannot reach the Hub at " + o.endpoint), std::string::npos) << m;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(HubDownload, ACacheThatCannotBeWrittenIsAnIoError) {
  FakeHub server;
  server.add("org/tiny", tiny_repo());
  TempDir d;
  testing::write_file(d / "not-a-folder", "x");
  const ResolveOptions o = options_for(d / "not-a-folder" / "hub", server);
  EXPECT_THROW(hub::download_model(id_of("org/tiny"), o), IoError);
  const std::string m = message_of([&] { hub::download_model(id_of("org/tiny"), o); });
  EXPECT_NE(m.find("not-a-folder"), std::string::npos) << m;
}

// The CLI end to end: `osprey pull` prints the snapshot folder; `generate -m org/demo
// --download` fetches models/demo's files from the server and prints the tokens `-m
// models/demo` prints.
TEST(HubDownload, CliPullAndGenerateWithDownload) {
  FakeHub server;
  server.add("org/tiny", tiny_repo());
  const fs::path demo = testing::source_dir() / "models" / "demo";
  FakeRepo demo_repo;
  demo_repo.revisions = {{"main", kCommit}};
  int i = 0;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    demo_repo.files[f] = {testing::read_file(demo / f), std::string(40, char('a' + i++)), false};
  demo_repo.files["model.safetensors"] = {testing::read_file(demo / "model.safetensors"), std::string(64, 'f'), true};
  demo_repo.files["README.md"] = {testing::read_file(demo / "README.md"), std::string(40, '0'), false};
  server.add("org/demo", demo_repo);
  TempDir cache;
  const std::string env = "HF_HUB_CACHE=" + cache.path().string() + " HF_ENDPOINT=" + server.endpoint();
  auto pull = testing::run_osprey("pull org/tiny", env);
  ASSERT_EQ(pull.exit_code, 0) << pull.err;
  EXPECT_EQ(pull.out, (cache / "models--org--tiny" / "snapshots" / kCommit).string() + "\n");
  EXPECT_TRUE(fs::is_symlink(cache / "models--org--tiny" / "snapshots" / kCommit / "model.safetensors"));

  const std::string args = " -p 'The little bird' -n 12 --json";
  auto by_folder = testing::run_osprey("generate -m " + demo.string() + args);
  ASSERT_EQ(by_folder.exit_code, 0) << by_folder.err;
  auto without = testing::run_osprey("generate -m org/demo" + args, env);
  EXPECT_EQ(without.exit_code, 1);
  EXPECT_NE(without.err.find("osprey pull org/demo"), std::string::npos) << without.err;
  auto by_id = testing::run_osprey("generate -m org/demo --download" + args, env);
  ASSERT_EQ(by_id.exit_code, 0) << by_id.err;
  EXPECT_EQ(nlohmann::json::parse(by_id.out)["tokens"], nlohmann::json::parse(by_folder.out)["tokens"]);
  EXPECT_FALSE(fs::exists(cache / "models--org--demo" / "snapshots" / kCommit / "README.md"));

  // A repository of GGUF files: the tag picks the file for pull and for -m.
  FakeRepo gguf_repo;
  gguf_repo.revisions = {{"main", kCommit}};
  const fs::path q4 = testing::source_dir() / "tests/fixtures/gguf/llama-q4_0.gguf";
  gguf_repo.files["llama-Q4_0.gguf"] = {testing::read_file(q4), std::string(64, 'e'), true};
  gguf_repo.files["llama-Q8_0.gguf"] = {testing::read_file(testing::source_dir() / "tests/fixtures/gguf/llama-q8_0.gguf"),
                                        std::string(64, 'd'), true};
  server.add("org/llama-GGUF", gguf_repo);
  auto by_file = testing::run_osprey("generate -m " + q4.string() + " -p 'hello' -n 4 --json");
  ASSERT_EQ(by_file.exit_code, 0) << by_file.err;
  auto by_tag = testing::run_osprey("generate -m org/llama-GGUF:q4_0 --download -p 'hello' -n 4 --json", env);
  ASSERT_EQ(by_tag.exit_code, 0) << by_tag.err;
  EXPECT_EQ(nlohmann::json::parse(by_tag.out)["tokens"], nlohmann::json::parse(by_file.out)["tokens"]);
  EXPECT_FALSE(fs::exists(cache / "models--org--llama-GGUF" / "snapshots" / kCommit / "llama-Q8_0.gguf"));
  auto pull_tag = testing::run_osprey("pull org/llama-GGUF:Q8_0", env);
  ASSERT_EQ(pull_tag.exit_code, 0) << pull_tag.err;
  EXPECT_EQ(pull_tag.out, (cache / "models--org--llama-GGUF" / "snapshots" / kCommit / "llama-Q8_0.gguf").string() + "\n");
  auto no_tag = testing::run_osprey("pull org/llama-GGUF:Q6_K", env);
  EXPECT_EQ(no_tag.exit_code, 1);
  EXPECT_NE(no_tag.err.find("no GGUF file of org/llama-GGUF is tagged Q6_K (its GGUF files: llama-Q4_0.gguf, "
                            "llama-Q8_0.gguf)"),
            std::string::npos)
      << no_tag.err;

  auto gated = testing::run_osprey("pull org/absent", env);
  EXPECT_EQ(gated.exit_code, 1);
  EXPECT_NE(gated.err.find("no model org/absent on the Hub"), std::string::npos) << gated.err;
  auto offline = testing::run_osprey("pull org/tiny:dev", env + " HF_HUB_OFFLINE=1");
  EXPECT_EQ(offline.exit_code, 1);
  EXPECT_NE(offline.err.find("HF_HUB_OFFLINE"), std::string::npos) << offline.err;
  auto not_id = testing::run_osprey("pull ./some/folder", env);
  EXPECT_EQ(not_id.exit_code, 2);
  EXPECT_NE(not_id.err.find("not a Hub id"), std::string::npos) << not_id.err;
}

}  // namespace osprey
