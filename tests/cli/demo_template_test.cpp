// The demo model's chat template renders a conversation's history as it was generated, so the
// next turn finds the whole previous turn in chat's prompt cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;

TEST(DemoTemplate, SecondChatTurnReusesTheWholeFirstTurn) {
  testing::TempDir d;
  testing::write_file(d / "stdin", "Hello there\nHow are you\n");
  const std::string demo = (testing::source_dir() / "models/demo").string();
  const std::string cmd = std::string(OSPREY_BINARY) + " chat -m " + demo + " --device cpu --json -n 24 <" +
                          (d / "stdin").string() + " >" + (d / "out").string() + " 2>" + (d / "err").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::read_file(d / "err");
  std::istringstream lines(testing::read_file(d / "out"));
  std::string line;
  std::vector<json> turns;
  while (std::getline(lines, line)) turns.push_back(json::parse(line));
  ASSERT_EQ(turns.size(), 2u);
  const size_t first_prompt = turns[0]["conversation_tokens"], first_reply = turns[0]["tokens"].size();
  ASSERT_GT(first_reply, 0u);
  // The cache holds every token the model has read: the first prompt and the reply, less the
  // last reply token when the reply ended at -n (that token was sampled, never read back).
  const size_t read = first_prompt + first_reply - (turns[0]["stop_reason"] == "length" ? 1 : 0);
  EXPECT_EQ(turns[1]["cached_tokens"], read) << turns[0].dump() << "\n" << turns[1].dump();
}

}  // namespace
}  // namespace osprey
