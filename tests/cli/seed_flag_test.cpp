// generate's --seed: a random seed unless one is given, reported by --json and -v.
#include <gtest/gtest.h>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::run_osprey;

// 30 tokens of the demo model at `flags` (temperature 1 unless they say otherwise).
json generate(std::string flags) {
  if (flags.find("--temp") == std::string::npos) flags += " --temp 1";
  const std::string demo = (testing::source_dir() / "models/demo").string();
  auto r = run_osprey("generate -m " + demo + " --device cpu -p 'Emma Woodhouse' -n 30 --ignore-eos --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

}  // namespace

TEST(CliSeed, GenerateSamplesWithARandomSeedUnlessGivenOne) {
  const json a = generate(""), b = generate("");
  ASSERT_EQ(a["tokens"].size(), 30u);
  EXPECT_NE(a["seed"], b["seed"]);
  EXPECT_NE(a["tokens"], b["tokens"]);
  // The reported seed repeats the run.
  EXPECT_EQ(generate("--seed " + a["seed"].dump())["tokens"], a["tokens"]);
  const json s = generate("--seed 99");
  EXPECT_EQ(s["seed"], 99);
  EXPECT_EQ(generate("--seed 99")["tokens"], s["tokens"]);
  EXPECT_NE(generate("--seed -1")["seed"], generate("--seed -1")["seed"]);
  // Greedy does not depend on the seed.
  EXPECT_EQ(generate("--temp 0 --seed 1")["tokens"], generate("--temp 0 --seed 2")["tokens"]);
}

TEST(CliSeed, VerbosePrintsTheSeed) {
  const std::string demo = (testing::source_dir() / "models/demo").string();
  auto r = run_osprey("generate -m " + demo + " --device cpu -p Emma -n 2 --temp 1 --seed 4242 -v");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("seed: 4242\n"), std::string::npos) << r.err;
  // The seed is one of [0, 2^64): -2 and 2^64 are usage errors naming the flag.
  for (const char* bad : {"-2", "18446744073709551616", "x"}) {
    auto e = run_osprey("generate -m " + demo + " -p Emma --seed " + std::string(bad));
    EXPECT_EQ(e.exit_code, 2) << bad;
    EXPECT_NE(e.err.find("--seed"), std::string::npos) << e.err;
  }
}

}  // namespace osprey
