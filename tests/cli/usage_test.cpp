// The CLI's usage errors and help: a mistyped command or flag gets the name that was meant
// ("did you mean"), and --help is headed by the command line it describes and shows defaults.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>

#include "support/test_util.h"

namespace osprey {
namespace {

using testing::run_osprey;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CliUsage, MistypedCommandSuggestsTheNearestOne) {
  auto r = run_osprey("generat -p hello");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "unknown command 'generat'")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean 'generate'?")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(CliUsage, CommandFarFromEveryNameGetsNoSuggestion) {
  auto r = run_osprey("xyzzy");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "unknown command 'xyzzy'")) << r.err;
  EXPECT_FALSE(contains(r.err, "did you mean")) << r.err;
}

TEST(CliUsage, NoCommandListsTheCommands) {
  auto r = run_osprey("");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "generate")) << r.err;
  EXPECT_TRUE(contains(r.err, "serve")) << r.err;
}

TEST(CliUsage, LongerFlagSuggestsTheFlagItBeginsWith) {
  auto r = run_osprey("generate --temperature 0.5 -p hello");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "unknown option '--temperature'")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean '--temp'?")) << r.err;
}

TEST(CliUsage, FlagWithAValueAfterEqualsIsNamedWithoutIt) {
  auto r = run_osprey("serve --kvlayout=dense");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "unknown option '--kvlayout'; did you mean '--kv-layout'?")) << r.err;
}

TEST(CliUsage, MisspelledFlagSuggestsTheNearestOfItsCommand) {
  // An underscore for a dash: edit distance 1 from generate's --n-predict.
  auto r = run_osprey("generate --n_predict 4 -p hello");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean '--n-predict'?")) << r.err;
}

TEST(CliUsage, UnknownShortFlagIsNamed) {
  auto r = run_osprey("generate -x -p hello");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "unknown option '-x'")) << r.err;
}

TEST(CliUsage, StrayArgumentIsNamed) {
  auto r = run_osprey("generate hello");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "unexpected argument 'hello'")) << r.err;
}

TEST(CliUsage, TopLevelHelpIsHeadedByTheProgramName) {
  auto r = run_osprey("--help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Usage: osprey ")) << r.out;
  EXPECT_TRUE(contains(r.out, "generate")) << r.out;
}

TEST(CliUsage, CommandHelpIsHeadedByItsCommandLineAndShowsDefaults) {
  auto r = run_osprey("generate --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Usage: osprey generate")) << r.out;
  // generate's documented default of -n (README.md's CLI table).
  EXPECT_TRUE(contains(r.out, "(default: 128)")) << r.out;
  EXPECT_TRUE(contains(r.out, "--stop")) << r.out;
}

TEST(CliUsage, ServeHelpKeepsTheEngineKnobsUnderAdvanced) {
  auto r = run_osprey("serve --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const size_t advanced = r.out.find("Advanced:");
  ASSERT_NE(advanced, std::string::npos) << r.out;
  EXPECT_GT(r.out.find("--kv-layout"), advanced) << r.out;
  EXPECT_GT(r.out.find("--block-size"), advanced) << r.out;
  EXPECT_LT(r.out.find("--port"), advanced) << r.out;
  EXPECT_TRUE(contains(r.out, "(default: 8080)")) << r.out;
}

// --version names the commit the binary was built from, taken at build time: a build after a
// new commit names the new one, not the commit CMake was configured at. The commit is read here
// with git itself; the version from CMakeLists.txt's project() line.
TEST(CliUsage, VersionNamesTheVersionAndTheCommitBuilt) {
  const std::string cmake = testing::read_file(testing::source_dir() / "CMakeLists.txt");
  const std::string key = "project(osprey VERSION ";
  const size_t at = cmake.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::string version = cmake.substr(at + key.size(), cmake.find(' ', at + key.size()) - at - key.size());
  auto r = run_osprey("--version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "osprey " + version + " (")) << r.out;
  std::string commit;
  if (FILE* git = popen(("git -C '" + testing::source_dir().string() + "' rev-parse --short=12 HEAD 2>/dev/null").c_str(), "r")) {
    char line[64] = {};
    if (std::fgets(line, sizeof line, git)) commit = line;
    pclose(git);
  }
  while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
  if (commit.size() != 12) GTEST_SKIP() << "the source tree is not a git checkout: " << r.out;
  EXPECT_TRUE(contains(r.out, "(" + commit + ")") || contains(r.out, "(" + commit + "+dirty)")) << r.out << " vs " << commit;
}

}  // namespace
}  // namespace osprey
