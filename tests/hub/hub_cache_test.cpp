// Resolving -m: folders, files in them, and Hub ids against a Hugging Face cache laid out by
// hand as huggingface_hub writes it (refs/<revision> holds the commit; snapshots/<commit>/<file>
// is a symlink to ../../blobs/<etag>).
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hub/hub_cache.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using hub::HubId;
using hub::ResolveOptions;
using testing::TempDir;
using testing::write_file;

const std::string kMain = "0123456789abcdef0123456789abcdef01234567";
const std::string kDev = "89abcdef0123456789abcdef0123456789abcdef";

// Writes `files` (name -> bytes) as huggingface_hub does: each in blobs/<etag>, linked from
// snapshots/<commit>/<name>; the etag here is "blob-<commit prefix>-<name>".
void write_snapshot(const fs::path& repo, const std::string& commit, const std::map<std::string, std::string>& files) {
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / commit);
  for (const auto& [name, bytes] : files) {
    const std::string etag = "blob-" + commit.substr(0, 8) + "-" + name;
    write_file(repo / "blobs" / etag, bytes);
    fs::create_symlink("../../blobs/" + etag, repo / "snapshots" / commit / name);
  }
}

void write_ref(const fs::path& repo, const std::string& revision, const std::string& commit) {
  fs::create_directories((repo / "refs" / revision).parent_path());
  write_file(repo / "refs" / revision, commit);
}

ResolveOptions options_for(const fs::path& cache) {
  ResolveOptions o;
  o.cache_dir = cache;
  o.endpoint = "http://127.0.0.1:9";  // discard port: nothing here may reach it
  o.connect_timeout_s = 2;
  return o;
}

const std::map<std::string, std::string> kWholeModel = {
    {"config.json", "{}"}, {"tokenizer.json", "{}"}, {"model.safetensors", "weights"}};

// Runs the enclosing scope with the working folder at `dir`.
class InFolder {
 public:
  explicit InFolder(const fs::path& dir) : saved_(fs::current_path()) { fs::current_path(dir); }
  ~InFolder() { fs::current_path(saved_); }

 private:
  fs::path saved_;
};

std::string message_of(const std::function<void()>& f) { return testing::error_of(f, "(no error)"); }

}  // namespace

TEST(HubCache, ParsesHubIds) {
  auto id = hub::parse_hub_id("Qwen/Qwen3-0.6B");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->org, "Qwen");
  EXPECT_EQ(id->name, "Qwen3-0.6B");
  EXPECT_EQ(id->revision, "main");
  id = hub::parse_hub_id("meta-llama/Llama-3.2-1B:v1.0");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->name, "Llama-3.2-1B");
  EXPECT_EQ(id->revision, "v1.0");
  EXPECT_EQ(id->spec(), "meta-llama/Llama-3.2-1B:v1.0");
  id = hub::parse_hub_id("org/name:refs/pr/1");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->revision, "refs/pr/1");
  for (const char* not_id : {"name", "/abs/model", "./org/name", "a/b/c", "org/na--me", "org/.name", "org/", "/name",
                             "org/name.", "or..g/name", "org/na me"})
    EXPECT_FALSE(hub::parse_hub_id(not_id)) << not_id;
  EXPECT_THROW(hub::parse_hub_id("org/name:"), InvalidInput);
  EXPECT_THROW(hub::parse_hub_id("org/name:../../etc"), InvalidInput);
  EXPECT_THROW(hub::parse_hub_id("org/name:/abs"), InvalidInput);
  EXPECT_TRUE(hub::is_commit_hash(kMain));
  EXPECT_FALSE(hub::is_commit_hash("main"));
  EXPECT_FALSE(hub::is_commit_hash(kMain.substr(0, 39) + "G"));
}

TEST(HubCache, AGgufQuantizationTagIsNoRevision) {
  auto id = hub::parse_hub_id("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->quant, "Q4_K_M");
  EXPECT_EQ(id->revision, "main");
  EXPECT_EQ(id->spec(), "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M");
  for (const char* tag : {"q8_0", "F16", "bf16", "IQ4_XS", "UD-Q4_K_XL", "Q4_0", "tq1_0", "MXFP4"})
    EXPECT_TRUE(hub::is_gguf_quant_tag(tag)) << tag;
  for (const char* rev : {"main", "v1.0", "refs/pr/1", "Q", "dev", "qwen"}) {
    EXPECT_FALSE(hub::is_gguf_quant_tag(rev)) << rev;
    EXPECT_EQ(hub::parse_hub_id(std::string("org/name:") + rev)->quant, "") << rev;
  }
}

TEST(HubCache, AGgufTagPicksItsFileCaseInsensitivelyOrListsTheFiles) {
  TempDir cache;
  const fs::path repo = cache / "models--org--tiny-GGUF";
  write_snapshot(repo, kMain,
                 {{"tiny-Q4_K_M.gguf", "q4km"}, {"tiny.Q8_0.gguf", "q8"}, {"tiny-UD-Q4_K_XL.gguf", "ud"},
                  {"mmproj-tiny-F16.gguf", "proj"}, {"tiny-F16.gguf", "f16"}, {"README.md", "#"}});
  write_ref(repo, "main", kMain);
  const fs::path snap = repo / "snapshots" / kMain;
  EXPECT_EQ(hub::resolve_model("org/tiny-GGUF:Q4_K_M", options_for(cache.path())), (snap / "tiny-Q4_K_M.gguf").string());
  EXPECT_EQ(hub::resolve_model("org/tiny-GGUF:q8_0", options_for(cache.path())), (snap / "tiny.Q8_0.gguf").string());
  EXPECT_EQ(hub::resolve_model("org/tiny-GGUF:ud-q4_k_xl", options_for(cache.path())),
            (snap / "tiny-UD-Q4_K_XL.gguf").string());
  // The projector file is no model: F16 is the one model file.
  EXPECT_EQ(hub::resolve_model("org/tiny-GGUF:F16", options_for(cache.path())), (snap / "tiny-F16.gguf").string());
  // Q4_K picks nothing (Q4_K_M is not Q4_K), and the message lists the files.
  const std::string m = message_of([&] { hub::resolve_model("org/tiny-GGUF:Q4_K", options_for(cache.path())); });
  EXPECT_NE(m.find("org/tiny-GGUF:Q4_K: no GGUF file of org/tiny-GGUF is tagged Q4_K (its GGUF files: tiny-F16.gguf, "
                   "tiny-Q4_K_M.gguf, tiny-UD-Q4_K_XL.gguf, tiny.Q8_0.gguf)"),
            std::string::npos)
      << m;
  // Two files of one tag are ambiguous.
  const fs::path two = cache / "models--org--two-GGUF";
  write_snapshot(two, kMain, {{"a-Q8_0.gguf", "a"}, {"b-q8_0.gguf", "b"}});
  write_ref(two, "main", kMain);
  const std::string a = message_of([&] { hub::resolve_model("org/two-GGUF:Q8_0", options_for(cache.path())); });
  EXPECT_NE(a.find("several GGUF files of org/two-GGUF are tagged Q8_0 (its GGUF files: a-Q8_0.gguf, b-q8_0.gguf)"),
            std::string::npos)
      << a;
}

TEST(HubCache, CacheFolderPrecedenceIsHuggingFaceHubs) {
  EnvOptions env;
  env.hf_hub_cache = "/a/hub-cache";
  env.hf_home = "/b/hf-home";
  env.xdg_cache_home = "/c/xdg";
  env.home = "/d/home";
  EXPECT_EQ(hub::resolve_options(env).cache_dir, fs::path("/a/hub-cache"));
  env.hf_hub_cache.clear();
  EXPECT_EQ(hub::resolve_options(env).cache_dir, fs::path("/b/hf-home/hub"));
  env.hf_home.clear();
  EXPECT_EQ(hub::resolve_options(env).cache_dir, fs::path("/c/xdg/huggingface/hub"));
  env.xdg_cache_home.clear();
  EXPECT_EQ(hub::resolve_options(env).cache_dir, fs::path("/d/home/.cache/huggingface/hub"));
  env.hf_home = "~/hf";
  EXPECT_EQ(hub::resolve_options(env).cache_dir, fs::path("/d/home/hf/hub"));
  env.home.clear();
  env.hf_home.clear();
  EXPECT_TRUE(hub::resolve_options(env).cache_dir.empty());
}

TEST(HubCache, EndpointTokenAndOfflineComeFromTheEnvironmentOptions) {
  EnvOptions env;
  EXPECT_EQ(hub::resolve_options(env).endpoint, "https://huggingface.co");
  env.hf_endpoint = "http://mirror.example/";
  env.hf_token = "hf_secret";
  env.hf_hub_offline = true;
  const ResolveOptions o = hub::resolve_options(env);
  EXPECT_EQ(o.endpoint, "http://mirror.example");
  EXPECT_EQ(o.token, "hf_secret");
  EXPECT_TRUE(o.offline);
}

TEST(HubCache, ResolvesTheMainBranchThroughItsRef) {
  TempDir cache;
  const fs::path repo = cache / "models--org--tiny";
  write_snapshot(repo, kMain, kWholeModel);
  write_ref(repo, "main", kMain);
  const std::string folder = hub::resolve_model("org/tiny", options_for(cache.path()));
  EXPECT_EQ(folder, (repo / "snapshots" / kMain).string());
  EXPECT_EQ(testing::read_file(fs::path(folder) / "model.safetensors"), "weights");
}

TEST(HubCache, ResolvesABranchAndACommitByName) {
  TempDir cache;
  const fs::path repo = cache / "models--org--tiny";
  write_snapshot(repo, kMain, kWholeModel);
  write_snapshot(repo, kDev, {{"config.json", "{\"dev\":1}"}});
  write_ref(repo, "main", kMain);
  write_ref(repo, "dev", kDev);
  write_ref(repo, "refs/pr/1", kDev);
  const ResolveOptions o = options_for(cache.path());
  EXPECT_EQ(hub::resolve_model("org/tiny:dev", o), (repo / "snapshots" / kDev).string());
  EXPECT_EQ(hub::resolve_model("org/tiny:refs/pr/1", o), (repo / "snapshots" / kDev).string());
  EXPECT_EQ(hub::resolve_model("org/tiny:main", o), (repo / "snapshots" / kMain).string());
  // A commit needs no ref: the snapshot is named by it.
  fs::remove_all(repo / "refs");
  EXPECT_EQ(hub::resolve_model("org/tiny:" + kDev, o), (repo / "snapshots" / kDev).string());
  EXPECT_THROW(hub::resolve_model("org/tiny:dev", o), IoError);
}

TEST(HubCache, MissingModelNamesTheIdTheCacheAndOspreyPull) {
  TempDir cache;
  const ResolveOptions o = options_for(cache.path());
  std::string m = message_of([&] { hub::resolve_model("org/absent", o); });
  EXPECT_NE(m.find("org/absent"), std::string::npos) << m;
  EXPECT_NE(m.find("osprey pull org/absent"), std::string::npos) << m;
  EXPECT_NE(m.find(cache.path().string()), std::string::npos) << m;
  // The model is there, the revision is not.
  const fs::path repo = cache / "models--org--tiny";
  write_snapshot(repo, kMain, kWholeModel);
  write_ref(repo, "main", kMain);
  m = message_of([&] { hub::resolve_model("org/tiny:v2", o); });
  EXPECT_NE(m.find("osprey pull org/tiny:v2"), std::string::npos) << m;
  // A ref naming a snapshot that is gone.
  write_ref(repo, "stale", kDev);
  EXPECT_THROW(hub::resolve_model("org/tiny:stale", o), IoError);
}

TEST(HubCache, ARefThatIsNoCommitIsAnError) {
  TempDir cache;
  const fs::path repo = cache / "models--org--tiny";
  write_snapshot(repo, kMain, kWholeModel);
  write_ref(repo, "main", "not a commit");
  const std::string m = message_of([&] { hub::resolve_model("org/tiny", options_for(cache.path())); });
  EXPECT_NE(m.find("refs/main"), std::string::npos) << m;
  EXPECT_NE(m.find("commit hash"), std::string::npos) << m;
}

TEST(HubCache, AnExistingPathWinsOverAHubId) {
  TempDir work, cache;
  fs::create_directories(work / "org" / "tiny");
  const fs::path repo = cache / "models--org--tiny";
  write_snapshot(repo, kMain, kWholeModel);
  write_ref(repo, "main", kMain);
  InFolder in(work.path());
  EXPECT_EQ(hub::resolve_model("org/tiny", options_for(cache.path())), "org/tiny");
  fs::remove_all(work / "org");
  EXPECT_EQ(hub::resolve_model("org/tiny", options_for(cache.path())), (repo / "snapshots" / kMain).string());
}

TEST(HubCache, AFileNamesItsFolderAndAGgufFileIsItself) {
  TempDir d;
  write_file(d / "config.json", "{}");
  write_file(d / "model.safetensors", "x");
  write_file(d / "model-q4.gguf", "GGUF");
  const ResolveOptions o = options_for(d.path());
  EXPECT_EQ(hub::resolve_model((d / "config.json").string(), o), d.path().string());
  EXPECT_EQ(hub::resolve_model((d / "model.safetensors").string(), o), d.path().string());
  EXPECT_EQ(hub::resolve_model(d.path().string(), o), d.path().string());
  EXPECT_EQ(hub::resolve_model((d / "model-q4.gguf").string(), o), (d / "model-q4.gguf").string());
  fs::create_directories(d / "folder.gguf");  // a folder named .gguf is a folder
  EXPECT_EQ(hub::resolve_model((d / "folder.gguf").string(), o), (d / "folder.gguf").string());
  EXPECT_THROW(hub::resolve_model((d / "absent").string(), o), IoError);
}

TEST(HubCache, MissingModelFilesListsWhatARunNeeds) {
  TempDir d;
  EXPECT_EQ(hub::missing_model_files(d.path()),
            (std::vector<std::string>{"config.json", "tokenizer.json", "model.safetensors"}));
  write_file(d / "config.json", "{}");
  write_file(d / "tokenizer.json", "{}");
  write_file(d / "model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                                "c": "model-00001-of-00002.safetensors"}})");
  write_file(d / "model-00001-of-00002.safetensors", "x");
  EXPECT_EQ(hub::missing_model_files(d.path()), std::vector<std::string>{"model-00002-of-00002.safetensors"});
  write_file(d / "model-00002-of-00002.safetensors", "x");
  EXPECT_TRUE(hub::missing_model_files(d.path()).empty());
}

TEST(HubCache, DownloadIsSkippedWhenTheCacheHoldsTheWholeModel) {
  TempDir cache;
  const fs::path repo = cache / "models--org--tiny";
  write_snapshot(repo, kMain, kWholeModel);
  write_ref(repo, "main", kMain);
  ResolveOptions o = options_for(cache.path());
  o.download = true;  // the endpoint is a closed port: any request would fail
  EXPECT_EQ(hub::resolve_model("org/tiny", o), (repo / "snapshots" / kMain).string());
  o.offline = true;
  EXPECT_EQ(hub::resolve_model("org/tiny", o), (repo / "snapshots" / kMain).string());
}

// End to end: a cache made from models/demo's files, `generate -m org/demo` prints the same
// greedy tokens as `-m models/demo`, with no network (HF_HUB_OFFLINE, a dead endpoint).
TEST(HubCache, GenerateByHubIdMatchesTheFolder) {
  TempDir cache;
  const fs::path demo = testing::source_dir() / "models" / "demo";
  const fs::path repo = cache / "models--org--demo";
  std::map<std::string, std::string> files;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "model.safetensors"})
    files[f] = testing::read_file(demo / f);
  write_snapshot(repo, kMain, files);
  write_ref(repo, "main", kMain);
  const std::string args = " -p 'The little bird' -n 12 --json";
  auto by_folder = testing::run_osprey("generate -m " + demo.string() + args);
  auto by_id = testing::run_osprey("generate -m org/demo" + args, "HF_HUB_CACHE=" + cache.path().string() +
                                                                      " HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9");
  ASSERT_EQ(by_folder.exit_code, 0) << by_folder.err;
  ASSERT_EQ(by_id.exit_code, 0) << by_id.err;
  const auto a = nlohmann::json::parse(by_folder.out), b = nlohmann::json::parse(by_id.out);
  ASSERT_TRUE(a.contains("tokens"));
  EXPECT_EQ(a["tokens"].size(), 12u);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["text"], b["text"]);
  // The model folder also by a file inside it, which once failed looking for tokenizer.json.
  auto by_file = testing::run_osprey("generate -m " + (demo / "config.json").string() + args);
  ASSERT_EQ(by_file.exit_code, 0) << by_file.err;
  EXPECT_EQ(nlohmann::json::parse(by_file.out)["tokens"], a["tokens"]);
  // HF_HOME names the cache's parent; XDG_CACHE_HOME's huggingface/hub below it.
  TempDir home;
  fs::create_directories(home / "hf");
  fs::create_symlink(cache.path(), home / "hf" / "hub");
  auto by_home = testing::run_osprey("generate -m org/demo" + args, "env -u HF_HUB_CACHE HF_HOME=" +
                                                                        (home / "hf").string() + " HF_HUB_OFFLINE=1");
  ASSERT_EQ(by_home.exit_code, 0) << by_home.err;
  EXPECT_EQ(nlohmann::json::parse(by_home.out)["tokens"], a["tokens"]);
}

TEST(HubCache, CliNamesAMissingModelAndOspreyPull) {
  TempDir cache;
  auto r = testing::run_osprey("generate -m org/absent --token-ids 1 -n 1", "HF_HUB_CACHE=" + cache.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("osprey pull org/absent"), std::string::npos) << r.err;
  r = testing::run_osprey("tokenize -m org/absent hello", "HF_HUB_CACHE=" + cache.path().string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("osprey pull org/absent"), std::string::npos) << r.err;
  r = testing::run_osprey("generate -m org/x --token-ids 1 -n 1", "HF_HUB_OFFLINE=maybe");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HF_HUB_OFFLINE=maybe"), std::string::npos) << r.err;
}

}  // namespace osprey
