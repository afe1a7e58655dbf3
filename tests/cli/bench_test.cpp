// osprey bench through the CLI on a tiny random Llama: test names, samples and statistics,
// the KV write counters of each KV arm, and bad flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace osprey {
namespace {

using nlohmann::json;
using testing::run_osprey;
using testing::TempDir;
using testing::tiny_llama_config;
using testing::write_tiny_llama;

constexpr int kLayers = 2;  // tiny_llama_config's num_hidden_layers

json bench_json(const TempDir& d, const std::string& flags, const std::string& env = "") {
  auto r = run_osprey("bench -m " + d.path().string() + " " + flags + " -o json", env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

const json& find_test(const json& j, const std::string& name) {
  for (const json& t : j["tests"])
    if (t["name"] == name) return t;
  ADD_FAILURE() << "no test named " << name << " in " << j.dump();
  static const json none = json::object();
  return none;
}

// Checks samples, their statistics (recomputed here) and that t/s = tokens / seconds.
void expect_samples(const json& t, int64_t n_tokens, size_t n_runs) {
  ASSERT_TRUE(t.contains("samples_ts")) << t.dump();
  const std::vector<double> ts = t["samples_ts"], ns = t["samples_ns"];
  ASSERT_EQ(ts.size(), n_runs);
  ASSERT_EQ(ns.size(), n_runs);
  double sum = 0;
  for (size_t i = 0; i < n_runs; ++i) {
    EXPECT_GT(ts[i], 0.0);
    EXPECT_NEAR(ts[i], double(n_tokens) / (ns[i] * 1e-9), ts[i] * 1e-3);
    sum += ts[i];
  }
  const double mean = sum / double(n_runs);
  EXPECT_NEAR(t["avg_ts"].get<double>(), mean, mean * 1e-9);
  std::vector<double> sorted = ts;
  std::sort(sorted.begin(), sorted.end());
  const double median = n_runs % 2 ? sorted[n_runs / 2] : 0.5 * (sorted[n_runs / 2 - 1] + sorted[n_runs / 2]);
  EXPECT_NEAR(t["median_ts"].get<double>(), median, median * 1e-9);
  if (n_runs == 2) {
    EXPECT_NEAR(t["stddev_ts"].get<double>(), std::abs(ts[0] - ts[1]) / std::sqrt(2.0), mean * 1e-9);
  }
  EXPECT_GT(t["memory"]["peak_alloc_bytes"].get<size_t>(), 0u);
  EXPECT_GT(t["memory"]["peak_rss_bytes"].get<size_t>(), 0u);
}

void expect_kv(const json& t, uint64_t inplace, uint64_t copying) {
  EXPECT_EQ(t["kv"]["inplace_writes"].get<uint64_t>(), inplace) << t["name"];
  EXPECT_EQ(t["kv"]["copying_writes"].get<uint64_t>(), copying) << t["name"];
}

}  // namespace

TEST(CliBench, JsonHasTestsSamplesAndInPlaceCounters) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const json j = bench_json(d, "-p 8 -n 4 -d 0,16 -r 2");
  ASSERT_EQ(j["tests"].size(), 4u) << j.dump();
  EXPECT_EQ(j["kv"]["inplace_write"], true);
  EXPECT_EQ(j["model"]["model_type"], "llama");
  EXPECT_FALSE(j["osprey"]["commit"].get<std::string>().empty());
  EXPECT_GT(j["machine"]["n_threads"].get<int>(), 0);
  // Elements of the tensors write_tiny_llama writes: embedding and untied head, final norm,
  // and per layer q/k/v/o, gate/up/down and two norms.
  const int64_t h = 32, v = 64, f = 48, hd = 8, nh = 4, nkv = 2;
  const int64_t per_layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * f + 2 * h;
  EXPECT_EQ(j["model"]["n_params"].get<int64_t>(), 2 * v * h + h + kLayers * per_layer);

  const json& pp = find_test(j, "pp8");
  const json& tg = find_test(j, "tg4");
  const json& pp_d = find_test(j, "pp8 @ d16");
  const json& tg_d = find_test(j, "tg4 @ d16");
  expect_samples(pp, 8, 2);
  expect_samples(tg, 4, 2);
  expect_samples(pp_d, 8, 2);
  expect_samples(tg_d, 4, 2);
  EXPECT_EQ(tg_d["n_depth"], 16);
  EXPECT_EQ(tg_d["n_gen"], 4);
  // docs/design.md, "The KV cache contract": a multi-token write copies; the first write into an empty cache grows it
  // (copies); later single-token writes of the cache's own state go in place. The depth
  // fill is not counted.
  expect_kv(pp, 0, kLayers);
  expect_kv(tg, 3 * kLayers, kLayers);
  expect_kv(pp_d, 0, kLayers);
  expect_kv(tg_d, 4 * kLayers, 0);
}

TEST(CliBench, CopyingArmWritesNothingInPlace) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const json j = bench_json(d, "-p 8 -n 4 -d 0,16 -r 2", "OSPREY_KV_INPLACE_WRITE=0");
  EXPECT_EQ(j["kv"]["inplace_write"], false);
  expect_kv(find_test(j, "tg4"), 0, 4 * kLayers);
  expect_kv(find_test(j, "tg4 @ d16"), 0, 4 * kLayers);
  expect_samples(find_test(j, "tg4 @ d16"), 4, 2);
}

TEST(CliBench, MarkdownAndCsv) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  auto md = run_osprey("bench -m " + d.path().string() + " -p 8 -n 4 -r 1 --warmup 0");
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_NE(md.out.find("| model | size | params | backend | threads | test | t/s |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| pp8 |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| tg4 |"), std::string::npos) << md.out;
  auto csv = run_osprey("bench -m " + d.path().string() + " -p 8 -n 4 -r 1 --warmup 0 -o csv");
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 3) << csv.out;
  EXPECT_NE(csv.out.find("\"tg4\""), std::string::npos) << csv.out;
}

TEST(CliBench, BadFlagsExitNonZero) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const std::string m = "bench -m " + d.path().string();
  auto bad_list = run_osprey(m + " -p 8,x");
  EXPECT_EQ(bad_list.exit_code, 2);
  EXPECT_NE(bad_list.err.find("--n-prompt"), std::string::npos) << bad_list.err;
  EXPECT_EQ(run_osprey(m + " -n 4 -r 0").exit_code, 2);
  auto none = run_osprey(m + " -p 0 -n 0");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("no tests"), std::string::npos) << none.err;
  auto empty_item = run_osprey(m + " -p 8,,16");
  EXPECT_EQ(empty_item.exit_code, 2);
  EXPECT_NE(empty_item.err.find("--n-prompt"), std::string::npos) << empty_item.err;
  EXPECT_NE(empty_item.err.find("\"8,,16\" has an empty item"), std::string::npos) << empty_item.err;
  auto missing = run_osprey("bench -m /nonexistent/model -p 8 -n 4");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model"), std::string::npos) << missing.err;
  // tiny_llama_config's context is 512 positions.
  auto deep = run_osprey(m + " -p 8 -n 4 -d 510");
  EXPECT_EQ(deep.exit_code, 1);
  EXPECT_NE(deep.err.find("context of 512"), std::string::npos) << deep.err;
}

// --batch: one row per batch size, the token counts and rows held as the table defines them,
// and the rates their quotients (recomputed here from the raw times). On the CPU: the tiny
// model's head_dim of 8 is below what the CUDA paged kernels take.
TEST(CliBench, BatchedTableAndItsArithmetic) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const json j = bench_json(d, "--batch 1,3 -p 8 -n 4 --device cpu");
  ASSERT_EQ(j["results"].size(), 2u) << j.dump();
  for (size_t i = 0; i < 2; ++i) {
    const json& r = j["results"][i];
    const int b = i == 0 ? 1 : 3;
    EXPECT_EQ(r["b"], b);
    EXPECT_EQ(r["pp"], 8);
    EXPECT_EQ(r["tg"], 4);
    EXPECT_EQ(r["n_kv"], b * 12);
    const double t_pp = r["t_pp"], t_tg = r["t_tg"];
    ASSERT_GT(t_pp, 0);
    ASSERT_GT(t_tg, 0);
    EXPECT_NEAR(double(r["s_pp"]), b * 8 / t_pp, 1e-6 * double(r["s_pp"]));
    EXPECT_NEAR(double(r["s_tg"]), b * 4 / t_tg, 1e-6 * double(r["s_tg"]));
    EXPECT_NEAR(double(r["s_tg_per_seq"]), 4 / t_tg, 1e-6 * double(r["s_tg_per_seq"]));
  }
  auto md = run_osprey("bench -m " + d.path().string() + " --batch 2 -p 8 -n 4 --device cpu");
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_NE(md.out.find("| PP | TG | B | N_KV |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| 8 | 4 | 2 | 24 |"), std::string::npos) << md.out;
}

TEST(CliBench, BatchedBadFlagsExitNonZero) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const std::string m = "bench -m " + d.path().string();
  auto zero = run_osprey(m + " --batch 0,4 -p 8 -n 4");
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_NE(zero.err.find("--batch"), std::string::npos) << zero.err;
  auto two = run_osprey(m + " --batch 2 -p 8,16 -n 4");
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_NE(two.err.find("one prompt size"), std::string::npos) << two.err;
  auto deep = run_osprey(m + " --batch 2 -p 500 -n 40 --device cpu");
  EXPECT_EQ(deep.exit_code, 1);
  EXPECT_NE(deep.err.find("context of 512"), std::string::npos) << deep.err;
}

// --json-schema holds every sequence of the --batch test to the schema: every sequence still
// decodes all -n steps (a complete document starts again), on the demo model's tokenizer.
TEST(CliBench, BatchedConstrainedRunsEveryStep) {
  const std::string demo = (testing::source_dir() / "models/demo").string();
  const std::string schema = (testing::source_dir() / "tests/fixtures/bench_orders.schema.json").string();
  auto r = run_osprey("bench -m " + demo + " --batch 1,3 -p 8 -n 40 --device cpu -o json --json-schema @" + schema);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_NE(std::string(j["constraint"]).find("bench_orders.schema.json"), std::string::npos) << j.dump();
  ASSERT_EQ(j["results"].size(), 2u) << j.dump();
  for (const json& row : j["results"]) {
    EXPECT_EQ(row["tg"], 40);
    EXPECT_GT(double(row["t_tg"]), 0);
  }
}

TEST(CliBench, ConstrainedBadFlagsExitNonZero) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());  // no tokenizer.json
  const std::string m = "bench -m " + d.path().string();
  auto no_batch = run_osprey(m + " --json-schema '{\"type\": \"string\"}'");
  EXPECT_EQ(no_batch.exit_code, 2);
  EXPECT_NE(no_batch.err.find("give --batch"), std::string::npos) << no_batch.err;
  auto both = run_osprey(m + " --batch 1 -p 8 -n 4 --device cpu --grammar-file x.gbnf --json-schema '{}'");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("give one"), std::string::npos) << both.err;
  auto no_tok = run_osprey(m + " --batch 1 -p 8 -n 4 --device cpu --json-schema '{\"type\": \"string\"}'");
  EXPECT_EQ(no_tok.exit_code, 2);
  EXPECT_NE(no_tok.err.find("tokenizer.json"), std::string::npos) << no_tok.err;
}

}  // namespace osprey

namespace osprey {
namespace {

// --temp samples the generated tokens (tg tests and --batch) and the output says so; the other
// sampling flags need it; a constrained --batch stays greedy, and --temp with it is refused.
TEST(CliBench, SampledDecodeIsNamedAndItsFlagsChecked) {
  TempDir d;
  write_tiny_llama(d.path(), tiny_llama_config());
  const json j = bench_json(d, "-p 0 -n 6 -r 1 --warmup 0 --device cpu --temp 0.8 --top-p 0.95 --top-k 20");
  EXPECT_EQ(j["params"]["sampling"], "temperature 0.8, top-k 20, top-p 0.95") << j.dump();
  expect_samples(find_test(j, "tg6"), 6, 1);
  const json greedy = bench_json(d, "-p 0 -n 6 -r 1 --warmup 0 --device cpu");
  EXPECT_FALSE(greedy["params"].contains("sampling")) << greedy.dump();
  const std::string m = "bench -m " + d.path().string();
  auto batch = run_osprey(m + " --batch 1,3 -p 8 -n 4 --device cpu --temp 0.8 --top-p 0.95 -o json");
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  const json b = json::parse(batch.out);
  EXPECT_EQ(b["sampling"], "temperature 0.8, top-p 0.95");
  ASSERT_EQ(b["results"].size(), 2u);
  EXPECT_EQ(b["results"][1]["n_kv"], 3 * 12);
  auto md = run_osprey(m + " --batch 2 -p 8 -n 4 --device cpu --temp 1");
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_NE(md.out.find("tokens sampled: temperature 1"), std::string::npos) << md.out;
  auto no_temp = run_osprey(m + " -p 0 -n 4 --top-p 0.9");
  EXPECT_EQ(no_temp.exit_code, 2);
  EXPECT_NE(no_temp.err.find("need --temp"), std::string::npos) << no_temp.err;
  const std::string schema = (testing::source_dir() / "tests/fixtures/bench_orders.schema.json").string();
  auto constrained = run_osprey(m + " --batch 2 -p 8 -n 4 --temp 0.8 --json-schema @" + schema);
  EXPECT_EQ(constrained.exit_code, 2);
  EXPECT_NE(constrained.err.find("decodes greedily"), std::string::npos) << constrained.err;
}

}  // namespace
}  // namespace osprey
