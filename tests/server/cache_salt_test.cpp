// Tenants and the prompt cache: a request with a cache_salt reuses only entries stored under
// the same salt (and its own), in both KV layouts, and --cache-salt-by-key keeps each API
// key's entries apart.
#include <gtest/gtest.h>

#include "server/harness.h"

namespace osprey {
namespace {

using nlohmann::json;

std::string long_prompt() {
  std::string p;
  for (int i = 0; i < 12; ++i) p += "Once upon a time there was a little girl named Emma. ";
  return p;
}

// The cached_tokens of one greedy completion of the long prompt.
int64_t cached(testing::TestServer& s, const std::string& salt, const httplib::Headers& headers = {}) {
  json body = {{"prompt", long_prompt()}, {"max_tokens", 2}, {"temperature", 0}};
  if (!salt.empty()) body["cache_salt"] = salt;
  auto [status, r] = s.post_json("/v1/completions", body, headers);
  EXPECT_EQ(status, 200) << r.dump();
  return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
}

void salts_never_share(KVLayout layout) {
  ServerOptions o = testing::demo_server_options();
  o.kv_layout = layout;
  testing::TestServer s(o);
  EXPECT_EQ(cached(s, "tenant-a"), 0);
  EXPECT_EQ(cached(s, "tenant-b"), 0) << "a salted request reused another salt's entries";
  EXPECT_EQ(cached(s, ""), 0) << "an unsalted request reused a salted entry";
  EXPECT_GT(cached(s, "tenant-a"), 0) << "a salted request did not reuse its own entries";
  EXPECT_GT(cached(s, "tenant-b"), 0);
  EXPECT_GT(cached(s, ""), 0);
}

}  // namespace

TEST(CacheSalt, SaltsNeverShareEntriesPaged) { salts_never_share(KVLayout::paged); }

TEST(CacheSalt, SaltsNeverShareEntriesDense) { salts_never_share(KVLayout::dense); }

TEST(CacheSalt, EmptySaltIsRefused) {
  testing::TestServer s;
  auto [status, r] = s.post_json("/v1/completions", {{"prompt", "Emma"}, {"max_tokens", 1}, {"cache_salt", ""}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "cache_salt");
}

TEST(CacheSalt, EachApiKeyIsASaltOfItsOwn) {
  ServerOptions o = testing::demo_server_options();
  o.api_keys = {"key-one", "key-two"};
  o.cache_salt_by_key = true;
  testing::TestServer s(o);
  const httplib::Headers one = {{"Authorization", "Bearer key-one"}}, two = {{"Authorization", "Bearer key-two"}};
  EXPECT_EQ(cached(s, "", one), 0);
  EXPECT_EQ(cached(s, "", two), 0) << "one API key's requests reused another's entries";
  EXPECT_GT(cached(s, "", one), 0);
  EXPECT_GT(cached(s, "", two), 0);
  // Both keys are accepted; a third is not.
  auto [status, r] = s.post_json("/v1/completions", {{"prompt", "Emma"}, {"max_tokens", 1}},
                                 {{"Authorization", "Bearer key-three"}});
  EXPECT_EQ(status, 401);
}

}  // namespace osprey
