// osprey perplexity through the CLI on the demo model: the KL divergence of a model from
// itself, the base file's header checks, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::run_osprey;
using testing::TempDir;
using testing::write_file;

const std::string kText =
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
    "of a wife. However little known the feelings or views of such a man may be on his first entering a "
    "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
    "the rightful property of some one or other of their daughters.\n";

std::string demo() { return (testing::source_dir() / "models/demo").string(); }

TEST(PerplexityCli, SelfKlDivergenceIsZeroAndTopOneAgrees) {
  TempDir d;
  write_file(d / "text.txt", kText + kText);
  const std::string base = (d / "base.kld").string();
  const std::string common = "perplexity -m " + demo() + " --device cpu -c 32 -f " + (d / "text.txt").string();
  auto w = run_osprey(common + " --kl-divergence-base " + base + " -o json");
  ASSERT_EQ(w.exit_code, 0) << w.err;
  const json a = json::parse(w.out);
  EXPECT_GE(a["n_chunks"].get<int>(), 2);
  EXPECT_EQ(a["n_scored"].get<int>(), a["n_chunks"].get<int>() * 15);
  EXPECT_GT(a["ppl"].get<double>(), 1.0);
  auto r = run_osprey(common + " --kl-divergence-base " + base + " --kl-divergence -o json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json b = json::parse(r.out);
  EXPECT_NEAR(b["ppl"].get<double>(), a["ppl"].get<double>(), 1e-9);
  const json& k = b["kl_divergence"];
  EXPECT_NEAR(k["mean"].get<double>(), 0.0, 1e-6);
  EXPECT_NEAR(k["max"].get<double>(), 0.0, 1e-5);
  EXPECT_EQ(k["same_top_p"].get<double>(), 1.0);
  // The base file's log-probs are 16-bit quantized: its PPL is the model's to 1e-3 relative.
  EXPECT_NEAR(k["base_ppl"].get<double>(), a["ppl"].get<double>(), a["ppl"].get<double>() * 1e-3);

  // The text output prints the running estimate and the final line.
  auto t = run_osprey(common);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("[1]"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("Final estimate: PPL = "), std::string::npos) << t.out;

  // Another text against the same base file: the token mismatch is named.
  write_file(d / "other.txt", kText + "Mr. Bennet was among the earliest of those who waited on Mr. Bingley. " + kText);
  auto m = run_osprey("perplexity -m " + demo() + " --device cpu -c 32 -f " + (d / "other.txt").string() +
                      " --kl-divergence-base " + base + " --kl-divergence");
  EXPECT_NE(m.exit_code, 0);
  EXPECT_NE(m.err.find("different text or tokenizer"), std::string::npos) << m.err;
  // Another chunk length: named.
  auto c = run_osprey(common.substr(0, common.find(" -c 32")) + " -c 64 -f " + (d / "text.txt").string() +
                      " --kl-divergence-base " + base + " --kl-divergence");
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.err.find("--ctx-size"), std::string::npos) << c.err;
}

TEST(PerplexityCli, BadInputIsRefusedByName) {
  TempDir d;
  write_file(d / "empty.txt", "");
  write_file(d / "short.txt", "It is a truth.");
  write_file(d / "junk.kld", "not a base file");
  const std::string m = "perplexity -m " + demo() + " --device cpu ";
  auto e = run_osprey(m + "-f " + (d / "empty.txt").string());
  EXPECT_NE(e.exit_code, 0);
  EXPECT_NE(e.err.find("empty"), std::string::npos) << e.err;
  auto s = run_osprey(m + "-c 64 -f " + (d / "short.txt").string());
  EXPECT_NE(s.exit_code, 0);
  EXPECT_NE(s.err.find("fewer than one chunk"), std::string::npos) << s.err;
  auto missing = run_osprey(m + "-f " + (d / "nope.txt").string());
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nope.txt"), std::string::npos) << missing.err;
  auto kl = run_osprey(m + "-f " + (d / "short.txt").string() + " --kl-divergence");
  EXPECT_EQ(kl.exit_code, 2);
  EXPECT_NE(kl.err.find("--kl-divergence-base"), std::string::npos) << kl.err;
  write_file(d / "text.txt", kText);
  auto j = run_osprey(m + "-c 16 -f " + (d / "text.txt").string() + " --kl-divergence-base " +
                      (d / "junk.kld").string() + " --kl-divergence");
  EXPECT_NE(j.exit_code, 0);
  EXPECT_NE(j.err.find("not a base file"), std::string::npos) << j.err;
  auto f = run_osprey(m + "-c -3 -f " + (d / "text.txt").string());
  EXPECT_EQ(f.exit_code, 2);
}

// The demo model's perplexity on a held text equals what transformers computes for the same
// definition (tools/perplexity_reference.py wrote the reference on the GPU machine: float32,
// the tokenizer.json by HF tokenizers; tests/fixtures/perplexity/README.md).
TEST(PerplexityCli, DemoModelMatchesTransformers) {
  const auto dir = testing::source_dir() / "tests/fixtures/perplexity";
  const json ref = json::parse(testing::read_file(dir / "demo_reference.json"));
  const int ctx = ref["ctx"].get<int>();
  auto r = run_osprey("perplexity -m " + demo() + " --device cpu -c " + std::to_string(ctx) + " -f " +
                      (dir / "austen.txt").string() + " -o json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json a = json::parse(r.out);
  EXPECT_EQ(a["n_chunks"].get<int>(), ref["n_chunks"].get<int>());
  EXPECT_EQ(a["n_scored"].get<int>(), ref["n_scored"].get<int>());
  const double ppl = ref["ppl"].get<double>();
  EXPECT_GT(ppl, 1.0);
  EXPECT_NEAR(a["ppl"].get<double>(), ppl, ppl * 1e-3);
}

}  // namespace
}  // namespace osprey
