// The mixture-of-experts families (qwen3_moe, mixtral) beyond what every family goes through
// in tests/model/family_test.cpp (their fixtures are in testing::kFamilies): the router's
// choice and weights against hand-worked cases, one MoE block against a double-precision sum
// of the experts it should use (on every device), the config.json and checkpoint spellings
// (num_experts or num_local_experts; per-expert or transformers 5's fused expert tensors),
// config and checkpoint errors that name the field or tensor, and on CUDA the fixtures' logits
// against the CPU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cuda_available.h"
#include "backend/ops.h"
#include "core/error.h"
#include "core/file_read.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "model/moe.h"
#include "model/weight_loader.h"
#include "support/device_test.h"
#include "support/family_harness.h"
#include "support/numeric.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::contains;
using testing::fixture_dir;
using testing::ints;
using testing::relative_row_error;
using testing::tokens_of;

// ---- the router ---------------------------------------------------------------------------

TEST(MoeRouter, ChoosesTheTopLogitsAndWeighsThemBySoftmax) {
  // exp(logits) = 1, 3, 2, 4: probabilities 0.1, 0.3, 0.2, 0.4 over all four experts.
  const std::vector<float> logits = {0.0f, float(std::log(3.0)), float(std::log(2.0)), float(std::log(4.0))};
  const MoeRouting all = route_tokens(logits, 4, 2, MoeWeighting::softmax_all);
  ASSERT_EQ(all.n_tokens, 1);
  EXPECT_EQ(all.experts, (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(all.weights[0], 0.4, 1e-6);
  EXPECT_NEAR(all.weights[1], 0.3, 1e-6);
  // Renormalized over the chosen two: 4/7 and 3/7, a softmax over their logits alone.
  const MoeRouting chosen = route_tokens(logits, 4, 2, MoeWeighting::softmax_chosen);
  EXPECT_EQ(chosen.experts, (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(chosen.weights[0], 4.0 / 7.0, 1e-6);
  EXPECT_NEAR(chosen.weights[1], 3.0 / 7.0, 1e-6);
}

TEST(MoeRouter, EqualLogitsGoToTheLowerExpertIndex) {
  // Three experts tie for two places: 1 and 2 win over 3; each gets half of the chosen mass.
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, 2.0f, -1.0f};
  const MoeRouting r = route_tokens(logits, 5, 2, MoeWeighting::softmax_chosen);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);
  // Over all experts: e^2 / (e^0.5 + 3 e^2 + e^-1) each.
  const double p = std::exp(2.0) / (std::exp(0.5) + 3 * std::exp(2.0) + std::exp(-1.0));
  const MoeRouting a = route_tokens(logits, 5, 2, MoeWeighting::softmax_all);
  EXPECT_EQ(a.experts, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(a.weights[0], p, 1e-7);
  EXPECT_NEAR(a.weights[1], p, 1e-7);
  // All equal: the first k.
  const MoeRouting flat = route_tokens(std::vector<float>(8, 0.25f), 8, 3, MoeWeighting::softmax_all);
  EXPECT_EQ(flat.experts, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_NEAR(flat.weights[2], 1.0 / 8.0, 1e-7);
}

TEST(MoeRouter, RoutesEachTokenOnItsOwnRow) {
  const std::vector<float> logits = {1, 0, 0, 5,   // token 0: experts 3, 0
                                     0, 7, 6, 0,   // token 1: experts 1, 2
                                     -3, -2, -1, -4};  // token 2: experts 2, 1
  const MoeRouting r = route_tokens(logits, 4, 2, MoeWeighting::softmax_chosen);
  ASSERT_EQ(r.n_tokens, 3);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{3, 0, 1, 2, 2, 1}));
  const double w = 1.0 / (1.0 + std::exp(-1.0));  // the larger of two logits one apart
  EXPECT_NEAR(r.weights[2], w, 1e-6);
  EXPECT_NEAR(r.weights[3], 1.0 - w, 1e-6);
  EXPECT_NEAR(r.weights[4], w, 1e-6);
}

TEST(MoeRouter, ANaNLogitRanksLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const MoeRouting r = route_tokens(std::vector<float>{nan, -5.0f, -6.0f}, 3, 2, MoeWeighting::softmax_chosen);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 2}));
}

TEST(MoeRouter, RejectsATopKOutsideTheExperts) {
  EXPECT_THROW(route_tokens(std::vector<float>(4, 0.0f), 4, 5, MoeWeighting::softmax_all), InvalidInput);
  EXPECT_THROW(route_tokens(std::vector<float>(4, 0.0f), 4, 0, MoeWeighting::softmax_all), InvalidInput);
  EXPECT_THROW(route_tokens(std::vector<float>(5, 0.0f), 4, 2, MoeWeighting::softmax_all), InvalidInput);
}

// ---- one block against the sum of the experts it should use -------------------------------

// A block of 6 experts (top 2, width 8) over hidden 8 whose router reads h's first six
// components as the logits, with every expert that no test token chooses set to NaN: the
// block's output is finite only if it reads the chosen experts alone.
constexpr int64_t kBlockHidden = 8, kBlockExperts = 6, kBlockWidth = 8;

struct BlockWeights {
  std::vector<std::vector<double>> gate, up, down;  // per expert, row-major
};

class MoeBlockTest : public testing::DeviceTest {
 protected:
  // Writes the block's tensors (bf16) with experts `unused` set to NaN, and loads it.
  std::unique_ptr<MoeBlock> load(const std::vector<int>& unused, MoeWeighting weighting) {
    std::mt19937 rng(17);
    std::normal_distribution<double> nd(0.0, 0.4);
    w_ = {};
    std::vector<std::pair<std::string, Array>> tensors;
    Array router = Array::empty({kBlockExperts, kBlockHidden}, DType::bf16);
    for (int64_t i = 0; i < router.numel(); ++i)
      router.data<uint16_t>()[i] = f32_to_bf16(i % kBlockHidden == i / kBlockHidden ? 1.0f : 0.0f);
    tensors.emplace_back("moe.gate.weight", router);
    auto matrix = [&](int64_t rows, int64_t cols, bool nan, std::vector<double>& keep) {
      Array a = Array::empty({rows, cols}, DType::bf16);
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint16_t b = f32_to_bf16(float(nd(rng)));
        keep.push_back(bf16_to_f32(b));
        a.data<uint16_t>()[i] = nan ? f32_to_bf16(std::numeric_limits<float>::quiet_NaN()) : b;
      }
      return a;
    };
    for (int e = 0; e < kBlockExperts; ++e) {
      const bool nan = std::find(unused.begin(), unused.end(), e) != unused.end();
      w_.gate.emplace_back();
      w_.up.emplace_back();
      w_.down.emplace_back();
      const std::string p = "moe.experts." + std::to_string(e) + ".";
      tensors.emplace_back(p + "gate_proj.weight", matrix(kBlockWidth, kBlockHidden, nan, w_.gate.back()));
      tensors.emplace_back(p + "up_proj.weight", matrix(kBlockWidth, kBlockHidden, nan, w_.up.back()));
      tensors.emplace_back(p + "down_proj.weight", matrix(kBlockHidden, kBlockWidth, nan, w_.down.back()));
    }
    write_safetensors(dir_.path() / "block.safetensors", tensors);
    st_ = std::make_unique<SafeTensors>(SafeTensors::open_file(dir_.path() / "block.safetensors"));
    LoadOptions lo;
    lo.device = device();
    WeightLoader w(*st_, lo);
    MoeConfig c{kBlockExperts, 2, kBlockWidth, weighting};
    MoeTensorNames names;
    names.router = names.fused_router = "moe.gate";
    names.experts = "moe.experts.";
    names.gate = "gate_proj";
    names.up = "up_proj";
    names.down = "down_proj";
    names.fused_gate_up = "moe.experts.gate_up_proj";
    names.fused_down = "moe.experts.down_proj";
    auto block = std::make_unique<MoeBlock>(FeedForwardContext{w, "", 0, kBlockHidden, DType::bf16}, c, names);
    w.finish();
    return block;
  }

  // The expert's gated MLP of x, in double.
  std::vector<double> expert(int e, const std::vector<double>& x) const {
    std::vector<double> act(kBlockWidth), y(kBlockHidden, 0.0);
    for (int64_t i = 0; i < kBlockWidth; ++i) {
      double g = 0, u = 0;
      for (int64_t j = 0; j < kBlockHidden; ++j) {
        g += w_.gate[size_t(e)][size_t(i * kBlockHidden + j)] * x[size_t(j)];
        u += w_.up[size_t(e)][size_t(i * kBlockHidden + j)] * x[size_t(j)];
      }
      act[size_t(i)] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t o = 0; o < kBlockHidden; ++o)
      for (int64_t i = 0; i < kBlockWidth; ++i) y[size_t(o)] += w_.down[size_t(e)][size_t(o * kBlockWidth + i)] * act[size_t(i)];
    return y;
  }

  testing::TempDir dir_;
  std::unique_ptr<SafeTensors> st_;
  BlockWeights w_;
};

TEST_P(MoeBlockTest, ComputesTheWeightedSumOfTheChosenExpertsAndReadsNoOther) {
  // Tokens whose first six components are the router logits (the last two only feed the
  // experts): token 0 -> experts 2 (logit 3) and 5 (2); token 1 -> 0 and 2; token 2 -> 5 and 0.
  const std::vector<std::vector<double>> tokens = {{0.1, -0.4, 3.0, 0.5, 0.2, 2.0, 0.7, -1.1},
                                                   {1.5, 0.3, 1.2, -2.0, 0.0, 0.4, -0.6, 0.9},
                                                   {0.9, -1.0, 0.2, 0.1, -0.3, 1.8, 1.3, 0.4}};
  const std::vector<std::vector<int>> chosen = {{2, 5}, {0, 2}, {5, 0}};
  for (MoeWeighting weighting : {MoeWeighting::softmax_chosen, MoeWeighting::softmax_all}) {
    auto block = load({1, 3, 4}, weighting);
    Array h = Array::empty({3, kBlockHidden}, DType::f32);
    for (size_t t = 0; t < 3; ++t)
      for (size_t j = 0; j < size_t(kBlockHidden); ++j) h.data<float>()[t * kBlockHidden + j] = float(tokens[t][j]);
    // All three tokens at once (prefill), and each alone (decode).
    Array all = ops::to_device(block->forward(ops::to_device(h, device())), Device::cpu());
    for (size_t t = 0; t < 3; ++t) {
      Array one = ops::to_device(block->forward(ops::to_device(h.slice_rows(int64_t(t), int64_t(t) + 1), device())),
                                 Device::cpu());
      // The reference: softmax over the chosen logits, or over all six.
      double z_all = 0, z_chosen = 0;
      for (int e = 0; e < kBlockExperts; ++e) z_all += std::exp(tokens[t][size_t(e)]);
      for (int e : chosen[t]) z_chosen += std::exp(tokens[t][size_t(e)]);
      std::vector<double> ref(kBlockHidden, 0.0);
      for (int e : chosen[t]) {
        const double wt =
            std::exp(tokens[t][size_t(e)]) / (weighting == MoeWeighting::softmax_chosen ? z_chosen : z_all);
        const std::vector<double> y = expert(e, tokens[t]);
        for (size_t o = 0; o < size_t(kBlockHidden); ++o) ref[o] += wt * y[o];
      }
      const double tol = on_cuda() ? 2e-2 : 1e-5;  // CUDA's prefill GEMM rounds activations
      for (size_t o = 0; o < size_t(kBlockHidden); ++o) {
        ASSERT_TRUE(std::isfinite(all.data<float>()[t * kBlockHidden + o])) << "token " << t << " read an unused expert";
        EXPECT_NEAR(all.data<float>()[t * kBlockHidden + o], ref[o], tol * (1 + std::fabs(ref[o]))) << "token " << t;
        EXPECT_NEAR(one.data<float>()[o], ref[o], (on_cuda() ? 1e-3 : 1e-5) * (1 + std::fabs(ref[o])))
            << "token " << t << " alone";
      }
    }
  }
}

TEST_P(MoeBlockTest, ATokenComputesTheSameAloneAndInABatchWhenBatchInvariant) {
  const bool before = ops::batch_invariant();
  ops::set_batch_invariant(true);
  auto block = load({}, MoeWeighting::softmax_chosen);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Array h = Array::empty({9, kBlockHidden}, DType::f32);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = nd(rng);
  Array all = ops::to_device(block->forward(ops::to_device(h, device())), Device::cpu());
  for (int64_t t = 0; t < 9; ++t) {
    Array one = ops::to_device(block->forward(ops::to_device(h.slice_rows(t, t + 1), device())), Device::cpu());
    EXPECT_EQ(std::memcmp(one.raw(), all.data<float>() + t * kBlockHidden, size_t(kBlockHidden) * 4), 0)
        << "token " << t;
  }
  ops::set_batch_invariant(before);
}

INSTANTIATE_TEST_SUITE_P(Devices, MoeBlockTest, OSPREY_DEVICES);

// ---- config.json and checkpoint spellings ---------------------------------------------------

// The fixture's tensors, by name, as stored.
std::vector<std::pair<std::string, Array>> fixture_tensors(const std::string& fixture) {
  const SafeTensors st = SafeTensors::open(fixture_dir(fixture));
  std::vector<std::pair<std::string, Array>> out;
  for (const std::string& name : st.names()) out.emplace_back(name, ops::cast(st.get(name), st.get(name).dtype()));
  return out;
}

nlohmann::json fixture_config(const std::string& fixture) {
  return nlohmann::json::parse(read_regular_file(fixture_dir(fixture) / "config.json"));
}

// A copy of a fixture with `config` and `tensors` as given.
void write_variant(const std::filesystem::path& dir, const nlohmann::json& config,
                   const std::vector<std::pair<std::string, Array>>& tensors) {
  std::filesystem::create_directories(dir);
  testing::write_file(dir / "config.json", config.dump(2));
  write_safetensors(dir / "model.safetensors", tensors);
}

// The logits of `dir`'s model over the fixture's tokens_1 (every position).
Array logits_of(const std::filesystem::path& dir, const std::vector<int32_t>& ids) {
  auto m = load_model(dir);
  SequenceCache cache = m->make_cache({});
  return ops::to_device(m->forward(tokens_of(ids), cache, true), Device::cpu());
}

double worst_rows(const Array& a, const Array& b) {
  double worst = 0;
  const int64_t vocab = a.dim(1);
  for (int64_t t = 0; t < a.dim(0); ++t)
    worst = std::max(worst, relative_row_error(a.data<float>() + t * vocab, b.data<float>() + t * vocab, vocab));
  return worst;
}

// The per-expert tensors of each sparse layer fused as transformers 5 holds them:
// <layer>.mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up rows), .down_proj [E, H, I],
// and the router under <layer>.mlp.gate. `block`: "mlp" (Qwen3-MoE) or "block_sparse_moe"
// (Mixtral, whose experts are w1 gate, w3 up, w2 down).
std::vector<std::pair<std::string, Array>> fuse_experts(const std::vector<std::pair<std::string, Array>>& in,
                                                        int64_t n_layers, int64_t n_experts, const std::string& block,
                                                        const std::string& gate, const std::string& up,
                                                        const std::string& down) {
  std::map<std::string, Array> by_name(in.begin(), in.end());
  std::vector<std::pair<std::string, Array>> out;
  for (const auto& [name, a] : in)
    if (name.find("." + block + ".experts.") == std::string::npos && name.find("." + block + ".gate.") == std::string::npos)
      out.emplace_back(name, a);
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (!by_name.count(p + block + ".gate.weight")) continue;  // a dense layer
    out.emplace_back(p + "mlp.gate.weight", by_name.at(p + block + ".gate.weight"));
    const Array g0 = by_name.at(p + block + ".experts.0." + gate + ".weight");
    const int64_t width = g0.dim(0), hidden = g0.dim(1);
    Array gu = Array::empty({n_experts, 2 * width, hidden}, g0.dtype());
    Array dn = Array::empty({n_experts, hidden, width}, g0.dtype());
    const size_t part = size_t(width * hidden) * g0.itemsize();
    for (int64_t e = 0; e < n_experts; ++e) {
      const std::string q = p + block + ".experts." + std::to_string(e) + ".";
      auto* dst = static_cast<uint8_t*>(gu.raw()) + size_t(e) * 2 * part;
      std::memcpy(dst, by_name.at(q + gate + ".weight").raw(), part);
      std::memcpy(dst + part, by_name.at(q + up + ".weight").raw(), part);
      std::memcpy(static_cast<uint8_t*>(dn.raw()) + size_t(e) * part, by_name.at(q + down + ".weight").raw(), part);
    }
    out.emplace_back(p + "mlp.experts.gate_up_proj", gu);
    out.emplace_back(p + "mlp.experts.down_proj", dn);
  }
  return out;
}

struct MoeFixture {
  std::string name, block, gate, up, down;
};
const std::vector<MoeFixture> kMoeFixtures = {{"qwen3-moe", "mlp", "gate_proj", "up_proj", "down_proj"},
                                              {"qwen3-moe-128", "mlp", "gate_proj", "up_proj", "down_proj"},
                                              {"mixtral", "block_sparse_moe", "w1", "w3", "w2"}};

TEST(MoeCheckpoints, FusedExpertTensorsGiveTheSameModelAsPerExpertOnes) {
  for (const MoeFixture& f : kMoeFixtures) {
    const nlohmann::json config = fixture_config(f.name);
    const int64_t n_experts = config.contains("num_experts") ? config["num_experts"].get<int64_t>()
                                                             : config["num_local_experts"].get<int64_t>();
    const auto per_expert = fixture_tensors(f.name);
    const auto fused = fuse_experts(per_expert, config["num_hidden_layers"], n_experts, f.block, f.gate, f.up, f.down);
    ASSERT_LT(fused.size(), per_expert.size()) << f.name;
    testing::TempDir dir;
    write_variant(dir.path(), config, fused);
    const SafeTensors ref(SafeTensors::open_file(fixture_dir(f.name) / "reference.safetensors"));
    const std::vector<int32_t> ids = ints(ref.get("tokens_1"));
    const double worst = worst_rows(logits_of(dir.path(), ids), logits_of(fixture_dir(f.name), ids));
    EXPECT_LT(worst, 1e-5) << f.name << ": the fused checkpoint computes another model";
  }
}

TEST(MoeConfig, EitherSpellingOfTheExpertCountGivesTheSameModel) {
  for (const MoeFixture& f : kMoeFixtures) {
    nlohmann::json config = fixture_config(f.name);
    const bool plain = config.contains("num_experts");
    const int64_t n = config[plain ? "num_experts" : "num_local_experts"];
    config.erase(plain ? "num_experts" : "num_local_experts");
    config[plain ? "num_local_experts" : "num_experts"] = n;
    testing::TempDir dir, both;
    write_variant(dir.path(), config, fixture_tensors(f.name));
    config["num_experts"] = n;
    config["num_local_experts"] = n;
    write_variant(both.path(), config, fixture_tensors(f.name));
    const SafeTensors ref(SafeTensors::open_file(fixture_dir(f.name) / "reference.safetensors"));
    const std::vector<int32_t> ids = ints(ref.get("tokens_0"));
    const Array base = logits_of(fixture_dir(f.name), ids);
    EXPECT_EQ(worst_rows(logits_of(dir.path(), ids), base), 0.0) << f.name;
    EXPECT_EQ(worst_rows(logits_of(both.path(), ids), base), 0.0) << f.name;
  }
}

// The message loading `fixture` with `edit` applied to its config.json (and `drop`, a tensor,
// left out of its checkpoint) fails with, or "(loaded)".
std::string variant_error(const std::string& fixture, const std::function<void(nlohmann::json&)>& edit,
                          const std::string& drop = "") {
  nlohmann::json config = fixture_config(fixture);
  edit(config);
  auto tensors = fixture_tensors(fixture);
  std::erase_if(tensors, [&](const auto& t) { return t.first == drop; });
  testing::TempDir dir;
  write_variant(dir.path(), config, tensors);
  try {
    load_model(dir.path());
  } catch (const InvalidInput& e) {
    return e.what();
  } catch (const Error& e) {
    return std::string("not InvalidInput: ") + e.what();
  }
  return "(loaded)";
}

TEST(MoeConfig, MalformedConfigsNameTheField) {
  for (const char* f : {"qwen3-moe", "mixtral"}) {
    SCOPED_TRACE(f);
    EXPECT_TRUE(contains(variant_error(f, [](nlohmann::json& c) { c.erase("num_experts_per_tok"); }),
                         "\"num_experts_per_tok\": missing"));
    EXPECT_TRUE(contains(variant_error(f, [](nlohmann::json& c) { c["num_experts_per_tok"] = 9; }),
                         "\"num_experts_per_tok\": must be between 1 and the 8 experts"));
    EXPECT_TRUE(contains(variant_error(f, [](nlohmann::json& c) { c["num_experts_per_tok"] = 0; }),
                         "\"num_experts_per_tok\""));
    EXPECT_TRUE(contains(variant_error(f,
                                       [](nlohmann::json& c) {
                                         c.erase("num_experts");
                                         c.erase("num_local_experts");
                                       }),
                         "\"num_experts\": missing"));
    EXPECT_TRUE(contains(variant_error(f,
                                       [](nlohmann::json& c) {
                                         c["num_experts"] = 8;
                                         c["num_local_experts"] = 4;
                                       }),
                         "\"num_local_experts\": 4 differs from num_experts 8"));
    EXPECT_TRUE(contains(variant_error(f, [](nlohmann::json& c) { c["num_experts"] = "eight"; }), "\"num_experts\""));
  }
  EXPECT_TRUE(contains(variant_error("qwen3-moe", [](nlohmann::json& c) { c.erase("moe_intermediate_size"); }),
                       "\"moe_intermediate_size\": missing"));
  EXPECT_TRUE(contains(variant_error("qwen3-moe", [](nlohmann::json& c) { c["mlp_only_layers"] = {0, 3}; }),
                       "\"mlp_only_layers\": 3 is not a layer index in [0, 3)"));
  EXPECT_TRUE(contains(variant_error("qwen3-moe", [](nlohmann::json& c) { c["decoder_sparse_step"] = 0; }),
                       "\"decoder_sparse_step\""));
  // A config whose sparse layers disagree with the checkpoint's: layer 1 is dense in the file.
  EXPECT_TRUE(contains(variant_error("qwen3-moe", [](nlohmann::json& c) { c["mlp_only_layers"] = nlohmann::json::array(); }),
                       "missing tensor model.layers.1.mlp.gate.weight"));
}

TEST(MoeCheckpoints, AMissingOrMisshapenExpertTensorIsNamed) {
  const auto keep = [](nlohmann::json&) {};
  EXPECT_TRUE(contains(variant_error("qwen3-moe", keep, "model.layers.2.mlp.experts.5.up_proj.weight"),
                       "missing tensor model.layers.2.mlp.experts.5.up_proj.weight"));
  EXPECT_TRUE(contains(variant_error("mixtral", keep, "model.layers.1.block_sparse_moe.experts.7.w2.weight"),
                       "missing tensor model.layers.1.block_sparse_moe.experts.7.w2.weight"));
  EXPECT_TRUE(contains(variant_error("mixtral", keep, "model.layers.0.block_sparse_moe.gate.weight"),
                       "missing tensor model.layers.0.block_sparse_moe.gate.weight"));
  // The expert width the config states is not the checkpoint's.
  EXPECT_TRUE(contains(variant_error("qwen3-moe", [](nlohmann::json& c) { c["moe_intermediate_size"] = 32; }),
                       "model.layers.0.mlp.experts.0.gate_proj.weight"));
  // A fused checkpoint with fewer experts than the config says.
  nlohmann::json config = fixture_config("qwen3-moe");
  auto fused = fuse_experts(fixture_tensors("qwen3-moe"), 3, 8, "mlp", "gate_proj", "up_proj", "down_proj");
  config["num_experts"] = 9;
  config["num_experts_per_tok"] = 2;
  testing::TempDir dir;
  write_variant(dir.path(), config, fused);
  try {
    load_model(dir.path());
    ADD_FAILURE() << "loaded";
  } catch (const InvalidInput& e) {
    EXPECT_TRUE(contains(e.what(), "model.layers.0.mlp"));
  }
}

TEST(MoeFamilies, AreRegisteredAndDecodeOnlyOnTheHost) {
  const std::vector<std::string> families = registered_families();
  EXPECT_NE(std::find(families.begin(), families.end(), "qwen3_moe"), families.end());
  EXPECT_NE(std::find(families.begin(), families.end(), "mixtral"), families.end());
  for (const MoeFixture& f : kMoeFixtures) {
    auto m = load_model(fixture_dir(f.name));
    EXPECT_FALSE(m->replayable_step()) << f.name << ": the routing is read back to the host every layer";
  }
  // A dense family is still captured.
  EXPECT_TRUE(load_model(fixture_dir("qwen3"))->replayable_step());
}

// ---- CUDA against the CPU ---------------------------------------------------------------------

TEST(MoeFamiliesOnCuda, TokenByTokenLogitsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  // Decode steps keep f32 activations on CUDA; the tensor-core attention rounds q and the
  // softmax weights to the K/V rows' 16 bits (family_test.cpp's decode_cuda tolerance).
  for (const MoeFixture& f : kMoeFixtures) {
    LoadOptions cpu_opt, cuda_opt;
    cuda_opt.device = Device::cuda(0);
    auto cpu = load_model(fixture_dir(f.name), cpu_opt);
    auto gpu = load_model(fixture_dir(f.name), cuda_opt);
    const SafeTensors ref(SafeTensors::open_file(fixture_dir(f.name) / "reference.safetensors"));
    const std::vector<int32_t> ids = ints(ref.get("tokens_1"));
    SequenceCache cc = cpu->make_cache({}), gc = gpu->make_cache({});
    double worst = 0;
    for (int32_t id : ids) {
      Array a = ops::to_device(cpu->forward(tokens_of({id}), cc, false), Device::cpu());
      Array b = ops::to_device(gpu->forward(tokens_of({id}), gc, false), Device::cpu());
      worst = std::max(worst, relative_row_error(b.data<float>(), a.data<float>(), a.dim(1)));
    }
    EXPECT_LT(worst, 1e-2) << f.name;
    RecordProperty(f.name + "_worst_rel_error", std::to_string(worst));
  }
}

TEST(MoeFamiliesOnCuda, PrefillLogitsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  // CUDA's prefill GEMMs round activations to the weights' bf16: the family tests' CUDA
  // tolerance for a prefill. A routing choice that rounding flips shows as a row far past it.
  for (const MoeFixture& f : kMoeFixtures) {
    LoadOptions cuda_opt;
    cuda_opt.device = Device::cuda(0);
    const SafeTensors ref(SafeTensors::open_file(fixture_dir(f.name) / "reference.safetensors"));
    const std::vector<int32_t> ids = ints(ref.get("tokens_2"));
    const Array a = logits_of(fixture_dir(f.name), ids);
    auto gpu = load_model(fixture_dir(f.name), cuda_opt);
    SequenceCache gc = gpu->make_cache({});
    const Array b = ops::to_device(gpu->forward(tokens_of(ids), gc, true), Device::cpu());
    const double worst = worst_rows(b, a);
    EXPECT_LT(worst, 2e-2) << f.name;
    RecordProperty(f.name + "_worst_rel_error", std::to_string(worst));
  }
}

}  // namespace
}  // namespace osprey
