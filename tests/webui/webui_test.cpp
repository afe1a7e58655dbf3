// The chat page module (server/webui.h): the embedded asset, content coding, ETags and 304,
// --no-webui and --webui-dir; and its hook in the server (no API key for the page, no second
// compression by the HTTP layer). Decoded bodies are checked against GNU gzip's.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "server/harness.h"
#include "server/webui.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::write_file;

fs::path asset_path() { return testing::source_dir() / "webui" / "prebuilt" / "index.html.gz"; }

// stdout of a shell command.
std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

// The file decoded by GNU gzip.
std::string gnu_gunzip(const fs::path& file) { return shell("gzip -dc '" + file.string() + "'"); }

std::string header(const WebUiResponse& r, const std::string& name) {
  for (const auto& [n, v] : r.headers)
    if (n == name) return v;
  return "";
}

WebUiResponse get(const std::string& target, const std::string& accept_encoding = "", const std::string& if_none_match = "",
                  const WebUiOptions& options = {}) {
  return serve_webui({"GET", target, if_none_match, accept_encoding}, options);
}

}  // namespace

TEST(WebUi, RootIsTheEmbeddedAssetGzippedWhenAccepted) {
  const WebUiResponse r = get("/", "gzip, deflate, br");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(header(r, "Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(header(r, "Content-Encoding"), "gzip");
  EXPECT_EQ(header(r, "Vary"), "Accept-Encoding");
  EXPECT_EQ(r.body, read_file(asset_path()));
}

TEST(WebUi, IdentityBodyIsTheAssetAsGnuGzipDecodesIt) {
  const std::string html = gnu_gunzip(asset_path());
  ASSERT_GT(html.size(), 1000u);
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  for (const char* accept : {"", "identity", "br", "deflate", "gzip;q=0", "*, gzip;q=0", "gzip; q=0.000"}) {
    const WebUiResponse r = get("/", accept);
    EXPECT_EQ(r.status, 200) << accept;
    EXPECT_EQ(header(r, "Content-Encoding"), "") << accept;
    EXPECT_EQ(r.body, html) << accept;
  }
  for (const char* accept : {"gzip", "GZIP", "x-gzip", "*", "br;q=1, gzip;q=0.5", "deflate,gzip"})
    EXPECT_EQ(header(get("/", accept), "Content-Encoding"), "gzip") << accept;
}

TEST(WebUi, IndexHtmlAndQueriesAreThePageOtherPathsAre404) {
  EXPECT_EQ(get("/index.html").body, get("/").body);
  EXPECT_EQ(get("/?conversation=1").body, get("/").body);
  for (const char* target : {"/app.js", "/v1/nothing", "/index.htm", "//", "/%zz", "relative"}) {
    const WebUiResponse r = get(target);
    EXPECT_TRUE(r.status == 404 || r.status == 400) << target << " " << r.status;
    EXPECT_EQ(header(r, "Content-Type"), "application/json") << target;
    const auto j = nlohmann::json::parse(r.body);
    EXPECT_TRUE(j["error"]["message"].is_string()) << target;
  }
  const WebUiResponse post = serve_webui({"POST", "/", "", ""}, {});
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(header(post, "Allow"), "GET, HEAD");
}

TEST(WebUi, MatchingIfNoneMatchAnswers304WithoutABody) {
  const WebUiResponse gz = get("/", "gzip"), plain = get("/");
  const std::string tag = header(gz, "ETag"), plain_tag = header(plain, "ETag");
  ASSERT_EQ(tag.front(), '"');
  ASSERT_EQ(tag.back(), '"');
  EXPECT_NE(tag, plain_tag);  // two representations, two strong validators
  for (const std::string& inm : {tag, plain_tag, "W/" + tag, "\"other\", " + tag, std::string("*")}) {
    const WebUiResponse r = get("/", "gzip", inm);
    EXPECT_EQ(r.status, 304) << inm;
    EXPECT_TRUE(r.body.empty()) << inm;
    EXPECT_EQ(header(r, "ETag"), tag) << inm;
    EXPECT_EQ(header(r, "Content-Encoding"), "") << inm;
  }
  for (const std::string& inm : {std::string("\"other\""), tag.substr(0, tag.size() - 2) + "\"", std::string("")}) {
    const WebUiResponse r = get("/", "gzip", inm);
    EXPECT_EQ(r.status, 200) << inm;
    EXPECT_FALSE(r.body.empty()) << inm;
  }
}

TEST(WebUi, NoWebuiAnswers404Everywhere) {
  WebUiOptions off;
  off.enabled = false;
  for (const char* target : {"/", "/index.html"}) {
    const WebUiResponse r = get(target, "gzip", "", off);
    EXPECT_EQ(r.status, 404) << target;
    EXPECT_NE(r.body.find("--no-webui"), std::string::npos) << r.body;
    EXPECT_FALSE(is_webui_target(target, off));
  }
  EXPECT_TRUE(is_webui_target("/", {}));
  EXPECT_TRUE(is_webui_target("/index.html?x", {}));
  EXPECT_FALSE(is_webui_target("/v1/models", {}));
  EXPECT_FALSE(is_webui_target("/app.js", {}));  // the embedded page is one file
}

TEST(WebUi, WebuiDirServesItsFilesAndNothingOutside) {
  testing::TempDir tmp;
  const fs::path dir = tmp / "page";
  fs::create_directories(dir / "sub");
  write_file(dir / "index.html", "<!doctype html><p>replacement</p>");
  write_file(dir / "app.js", "console.log('hi');\n");
  write_file(dir / "sub" / "look.css", "p { color: red; }\n");
  write_file(dir / "logo.png", std::string("\x89PNG\r\n\x1a\n", 8));
  write_file(tmp / "secret.txt", "not for the web");
  WebUiOptions o;
  o.dir = dir;
  EXPECT_NO_THROW(check_webui_options(o));

  const WebUiResponse root = get("/", "", "", o);
  EXPECT_EQ(root.status, 200);
  EXPECT_EQ(root.body, "<!doctype html><p>replacement</p>");
  EXPECT_EQ(header(root, "Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(get("/app.js", "", "", o).body, "console.log('hi');\n");
  EXPECT_EQ(header(get("/app.js", "", "", o), "Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(header(get("/sub/look.css", "", "", o), "Content-Type"), "text/css; charset=utf-8");
  EXPECT_EQ(header(get("/sub/look%2ecss", "", "", o), "Content-Type"), "text/css; charset=utf-8");
  const WebUiResponse png = get("/logo.png", "gzip", "", o);
  EXPECT_EQ(header(png, "Content-Type"), "image/png");
  EXPECT_EQ(header(png, "Content-Encoding"), "");  // already compressed formats go as they are

  // gzip on the fly, as GNU gzip decodes it.
  const WebUiResponse gz = get("/app.js", "gzip", "", o);
  EXPECT_EQ(header(gz, "Content-Encoding"), "gzip");
  write_file(tmp / "app.js.gz", gz.body);
  EXPECT_EQ(gnu_gunzip(tmp / "app.js.gz"), "console.log('hi');\n");

  for (const char* target : {"/../secret.txt", "/%2e%2e/secret.txt", "/sub/../../secret.txt", "/sub/%2E%2E/%2E%2E/secret.txt",
                             "/sub", "/sub/", "/./index.html", "/missing.js", "/sub\\..\\..\\secret.txt", "/%00index.html"}) {
    const WebUiResponse r = get(target, "", "", o);
    EXPECT_TRUE(r.status == 404 || r.status == 400) << target << ": " << r.status;
    EXPECT_EQ(r.body.find("not for the web"), std::string::npos) << target;
  }

  // The ETag follows the file's bytes.
  const std::string before = header(root, "ETag");
  EXPECT_EQ(get("/", "", before, o).status, 304);
  write_file(dir / "index.html", "<!doctype html><p>changed</p>");
  const WebUiResponse changed = get("/", "", before, o);
  EXPECT_EQ(changed.status, 200);
  EXPECT_NE(header(changed, "ETag"), before);
  EXPECT_EQ(changed.body, "<!doctype html><p>changed</p>");

  EXPECT_TRUE(is_webui_target("/app.js", o));
  EXPECT_FALSE(is_webui_target("/metrics", o));
}

TEST(WebUi, BadWebuiDirIsRefusedNamingTheFlag) {
  testing::TempDir tmp;
  WebUiOptions o;
  o.dir = tmp / "missing";
  try {
    check_webui_options(o);
    FAIL() << "a missing folder was accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--webui-dir"), std::string::npos) << e.what();
  }
  o.dir = tmp.path();  // no index.html
  EXPECT_THROW(check_webui_options(o), InvalidInput);
}

TEST(WebUi, GunzipRefusesACorruptStream) {
  std::string gz = read_file(asset_path());
  EXPECT_THROW(gunzip(gz.substr(0, gz.size() / 2)), InvalidInput);
  EXPECT_THROW(gunzip("not gzip at all"), InvalidInput);
  EXPECT_EQ(gunzip(gzip_compress("round trip")), "round trip");
}

TEST(WebUi, ServerAnswersThePageWithoutTheApiKeyAndCompressesItOnce) {
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"sekrit"};
  testing::TestServer s(o);
  auto c = s.client();
  c->set_decompress(false);
  auto r = c->Get("/", {{"Accept-Encoding", "gzip, br"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value_count("Content-Encoding"), 1u);
  EXPECT_EQ(r->get_header_value("Content-Encoding"), "gzip");
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(r->body, read_file(asset_path()));

  auto again = c->Get("/", {{"Accept-Encoding", "gzip"}, {"If-None-Match", r->get_header_value("ETag")}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 304);
  EXPECT_TRUE(again->body.empty());

  auto plain = c->Get("/", {{"Accept-Encoding", "identity"}});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->get_header_value("Content-Encoding"), "");
  EXPECT_EQ(plain->body, gnu_gunzip(asset_path()));

  auto head = c->Head("/");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());

  // The API still wants the key; unknown paths are 404 only once authenticated.
  EXPECT_EQ(s.get("/v1/models").first, 401);
  EXPECT_EQ(s.get("/metrics").first, 401);
  EXPECT_EQ(s.get("/favicon.ico").first, 401);
  EXPECT_EQ(s.get("/favicon.ico", {{"Authorization", "Bearer sekrit"}}).first, 404);
}

TEST(WebUi, ServerWithNoWebuiAnswers404AtRoot) {
  ServerOptions o = testing::demo_server_options();
  o.webui.enabled = false;
  testing::TestServer s(o);
  const auto [status, body] = s.get("/");
  EXPECT_EQ(status, 404);
  EXPECT_NE(body.find("--no-webui"), std::string::npos) << body;
  EXPECT_EQ(s.get("/health").first, 200);
}

TEST(WebUi, ServeFlagsAreChecked) {
  auto both = testing::run_osprey("serve --port 0 --no-webui --webui-dir /tmp");
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_NE(both.err.find("--no-webui"), std::string::npos) << both.err;
  auto missing = testing::run_osprey("serve --port 0 --webui-dir /nonexistent/osprey-webui");
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_NE(missing.err.find("--webui-dir"), std::string::npos) << missing.err;
}

}  // namespace osprey
