// `osprey chat`'s /image FILE: the image goes with the next message; its reply equals the
// library's greedy reply with the same image (the hand-derived prompt of image_chat_model.h),
// and a file that cannot be attached is an error naming it, after which the chat goes on.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include "support/family_harness.h"
#include "support/test_util.h"
#include "vision/image_chat_model.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using namespace testing::image_chat;
using testing::contains;

// `osprey ARGS` with stdin read from `input`.
testing::CommandResult run_with_stdin(const std::string& args, const std::string& input) {
  testing::TempDir out;
  testing::write_file(out / "in", input);
  const std::string cmd = std::string(OSPREY_BINARY) + " " + args + " >" + (out / "out").string() + " 2>" +
                          (out / "err").string() + " <" + (out / "in").string();
  const int status = std::system(cmd.c_str());
  testing::CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = testing::read_file(out / "out");
  r.err = testing::read_file(out / "err");
  return r;
}

TEST(ChatImage, ImageGoesWithTheNextMessageAndBadFilesAreNamed) {
  if (const std::string why = model_missing(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  write_image_model(dir.path());
  const fs::path image = kImages / "png_rgb_64x48.png";
  testing::write_file(dir / "broken.png", testing::read_file(image).substr(0, 300));
  const std::string input = "/image " + (dir / "missing.png").string() + "\n/image " + (dir / "broken.png").string() +
                            "\n/image " + image.string() + "\nDescribe this.\n";
  const testing::CommandResult r =
      run_with_stdin("chat -m " + dir.path().string() + " --device cpu -n 6 --temp 0 --json", input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "missing.png: cannot open file")) << r.err;
  EXPECT_TRUE(contains(r.err, "/image " + (dir / "broken.png").string() + ": image: malformed or truncated PNG")) << r.err;
  EXPECT_TRUE(contains(r.err, "attached to your next message")) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["conversation_tokens"], described_prompt().size());
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), library_reply(dir.path(), image, 6));
}

// chat --pan-and-scan: /image attaches the image and its crops (two, by the rule worked in
// library_pan_and_scan_reply); the reply equals the library's with them.
TEST(ChatImage, PanAndScanAttachesTheImageAndItsCrops) {
  if (const std::string why = model_missing(); !why.empty()) GTEST_SKIP() << why;
  testing::TempDir dir;
  write_image_model(dir.path());
  write_pan_and_scan_processor(dir.path());
  const fs::path image = kImages / "webp_lossy_96x64.webp";
  const testing::CommandResult r = run_with_stdin(
      "chat -m " + dir.path().string() + " --device cpu -n 6 --temp 0 --json --pan-and-scan",
      "/image " + image.string() + "\nDescribe this.\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "(96x64, 2 pan-and-scan crops) attached to your next message")) << r.err;
  std::vector<int64_t> starts;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["conversation_tokens"], pan_and_scan_prompt(starts).size());
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), library_pan_and_scan_reply(dir.path(), image, 6));
  const fs::path demo = testing::source_dir() / "models" / "demo";
  const testing::CommandResult t = run_with_stdin("chat -m " + demo.string() + " --device cpu --pan-and-scan", "Hi\n");
  EXPECT_NE(t.exit_code, 0);
  EXPECT_TRUE(contains(t.err, "--pan-and-scan: ")) << t.err;
  EXPECT_TRUE(contains(t.err, "takes no images")) << t.err;
}

TEST(ChatImage, TextOnlyModelRefusesTheImageAndChatsOn) {
  const fs::path demo = testing::source_dir() / "models" / "demo";
  const testing::CommandResult r = run_with_stdin("chat -m " + demo.string() + " --device cpu -n 2 --temp 0 --json",
                                                  "/image " + (kImages / "png_rgb_64x48.png").string() + "\nHi\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "/image: this model takes no image input")) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["predicted_n"], 2);
}

}  // namespace
}  // namespace osprey
