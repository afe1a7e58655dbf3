// MLX affine-quantized checkpoints: the quantized fixtures (tools/mlx_quant_reference.py)
// against transformers run on their dequantized weights, on the CPU and on CUDA; and
// malformed quantized checkpoints, each an InvalidInput that names the tensor or field.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "backend/cpu/quant_int8.h"
#include "backend/cpu_level.h"
#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "formats/config_reader.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "model/weight_loader.h"
#include "serve/generate.h"
#include "support/device_test.h"
#include "support/families.h"
#include "support/family_harness.h"
#include "support/numeric.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::ints;
using testing::relative_row_error;
using testing::TempDir;
using testing::tokens_of;

std::filesystem::path fixture(const std::string& name) { return testing::fixture_dir(name); }

struct Expected {
  int bits, group_size;
  DType dtype;
};

Expected expected_of(const std::string& name) {
  if (name == "llama-q4") return {4, 64, DType::bf16};
  if (name == "llama-q8") return {8, 64, DType::f16};
  return {4, 32, DType::bf16};  // qwen2-q4
}

Array to_cpu(const Array& a) { return ops::to_device(a, Device::cpu()); }

double worst_row_error(const Array& ours, const Array& ref) {
  double worst = 0;
  for (int64_t t = 0; t < ref.dim(0); ++t)
    worst = std::max(worst, relative_row_error(ours.data<float>() + t * ref.dim(1), ref.data<float>() + t * ref.dim(1),
                                               ref.dim(1)));
  return worst;
}

using testing::argmax;

class QuantReference : public testing::FixtureModelTest {
 protected:

  // Logits of one full forward pass over every position of sequence i.
  double prefill_error(int i) {
    const std::vector<int32_t> ids = ints(ref_->get("tokens_" + std::to_string(i)));
    Array ref = ref_->get("logits_" + std::to_string(i));
    SequenceCache cache = model_->make_cache({});
    Array ours = to_cpu(model_->forward(tokens_of(ids), cache, true));
    EXPECT_EQ(ours.shape(), ref.shape());
    return worst_row_error(ours, ref);
  }

  double decode_error() {
    const std::vector<int32_t> ids = ints(ref_->get("tokens_1"));
    Array ref = ref_->get("logits_1");
    SequenceCache cache = model_->make_cache({});
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      Array l = to_cpu(model_->forward(tokens_of({ids[t]}), cache, false));
      worst = std::max(worst, relative_row_error(l.data<float>(), ref.data<float>() + int64_t(t) * ref.dim(1), ref.dim(1)));
    }
    return worst;
  }

  // Free-running greedy output equals the reference up to the first step whose reference
  // margin is too small to call; with the reference tokens fed back (teacher forcing), every
  // clear-margin step's argmax must equal the reference, however early an unclear one came.
  void expect_greedy_matches() {
    int64_t clear_total = 0;
    for (int i = 0; i < 3; ++i) {
      const std::string n = std::to_string(i);
      const std::vector<int32_t> prompt = ints(ref_->get("greedy_prompt_" + n));
      const std::vector<int32_t> expected = ints(ref_->get("greedy_tokens_" + n));
      const float* margins = ref_->get("greedy_margins_" + n).data<float>();
      SequenceCache cache = model_->make_cache({});
      GenerateParams gp;
      gp.max_tokens = int(expected.size());
      GenerateResult r = generate(*model_, cache, prompt, gp);
      ASSERT_EQ(r.tokens.size(), expected.size());
      for (size_t s = 0; s < expected.size() && margins[s] > 0.05f; ++s)
        ASSERT_EQ(r.tokens[s], expected[s]) << "prompt " << i << ", free-running step " << s;

      std::vector<int32_t> forced = prompt;
      forced.insert(forced.end(), expected.begin(), expected.end() - 1);
      SequenceCache cache2 = model_->make_cache({});
      Array logits;  // [T + 63, vocab]
      if (on_cuda()) {
        // NOTE: one token per step keeps CUDA on its f32-activation decode path (1e-3 class);
        // its prefill GEMMs round activations to 16 bits, too coarse for a 0.05 margin.
        std::vector<Array> rows;
        for (int32_t t : forced) rows.push_back(to_cpu(model_->forward(tokens_of({t}), cache2, false)));
        logits = Array::empty({int64_t(rows.size()), rows[0].dim(1)}, DType::f32);
        for (size_t r = 0; r < rows.size(); ++r)
          std::copy(rows[r].data<float>(), rows[r].data<float>() + rows[r].dim(1),
                    logits.data<float>() + int64_t(r) * rows[r].dim(1));
      } else {
        logits = to_cpu(model_->forward(tokens_of(forced), cache2, true));
      }
      const int64_t vocab = logits.dim(1);
      for (size_t s = 0; s < expected.size(); ++s) {
        if (margins[s] <= 0.05f) continue;
        ++clear_total;
        const int64_t row = int64_t(prompt.size()) - 1 + int64_t(s);
        EXPECT_EQ(argmax(logits.data<float>() + row * vocab, vocab), expected[s])
            << "prompt " << i << ", teacher-forced step " << s << " (margin " << margins[s] << ")";
      }
    }
    EXPECT_GE(clear_total, 150) << "too few clear-margin steps to check";
  }

};

}  // namespace

TEST_P(QuantReference, LoadsTheQuantizationSetting) {
  const Expected e = expected_of(GetParam().model);
  EXPECT_EQ(model_->info().quant_bits, e.bits);
  EXPECT_EQ(model_->info().quant_group_size, e.group_size);
  EXPECT_EQ(model_->info().weight_dtype, e.dtype);
  // The quantized weights take fewer bytes than the dense bf16 source.
  const std::string source = GetParam().model.substr(0, GetParam().model.find('-'));
  EXPECT_LT(model_->info().weight_bytes, load_model(fixture(source))->info().weight_bytes);
}

TEST_P(QuantReference, CountsTheWeightsItEncodesAsItsDenseSource) {
  // Every weight of the dense source is encoded once in the quantized checkpoint (the fixtures
  // are its conversions), whether or not the CPU kept only the repacked tiles of a layer.
  const std::string source = GetParam().model.substr(0, GetParam().model.find('-'));
  EXPECT_EQ(model_->info().n_params, load_model(fixture(source))->info().n_params);
}

TEST_P(QuantReference, LogitsAtEveryPositionMatchTransformers) {
  // On CUDA prefill GEMMs round activations to 16 bits: the fp16-class tolerance of the dense
  // tests.
  for (int i = 0; i < 3; ++i) {
    const double worst = prefill_error(i);
    EXPECT_LT(worst, on_cuda() ? 1e-2 : 1e-3) << "sequence " << i;
    // The margin, in the XML report (--gtest_output=xml).
    RecordProperty("seq" + std::to_string(i) + "_worst_rel_error", std::to_string(worst));
  }
}

TEST_P(QuantReference, TokenByTokenDecodeMatchesTransformers) { EXPECT_LT(decode_error(), 1e-3); }

TEST_P(QuantReference, GreedyContinuationsMatchWhereMarginsAreClear) { expect_greedy_matches(); }

// CPU: a weight that only linear() reads keeps its tiles alone (LoadOptions::cpu_tiles_only,
// the default) where the level's kernels take them for every n; the embedding table keeps its
// packed words; the logits, prefill and decode, have the same bits either way.
TEST_P(QuantReference, TilesOnlyWeightsGiveTheSameLogitsAsKeptPackedWords) {
  if (on_cuda()) GTEST_SKIP() << "CPU tiles";
  const Expected e = expected_of(GetParam().model);
  cpu::Int8Isa isa;
  const bool level_takes = cpu::int8_isa_best(cpu_level(), &isa) && (e.bits == 4 || cpu::int8_isa_exact_u8(isa));
  const std::filesystem::path dir = fixture(GetParam().model);
  const SafeTensors st = SafeTensors::open(dir);
  const std::string prefix = "model.layers.0.self_attn.o_proj";
  const Shape shape = st.info(prefix + ".weight").shape;  // packed [out, in * bits / 32]
  const int64_t out = shape[0], in = shape[1] * 32 / e.bits;
  for (bool tiles_only : {true, false}) {
    LoadOptions opt;
    opt.device = device();
    opt.cpu_tiles_only = tiles_only;
    WeightLoader loader(st, opt, parse_quant_config(ConfigReader::load(dir / "config.json")));
    const LinearWeight w = loader.linear(prefix, out, in);
    ASSERT_TRUE(w.payload<QuantizedMatrix>());
    const QuantizedMatrix& q = *w.payload<QuantizedMatrix>();
    EXPECT_STREQ(w.method().name(), "mlx-affine");
    EXPECT_EQ(q.tiles_only(), tiles_only && level_takes) << "tiles_only=" << tiles_only;
    EXPECT_EQ(w.out_features(), out);
    EXPECT_EQ(w.in_features(), in);
    if (q.tiles_only()) {
      EXPECT_EQ(w.nbytes(), q.cpu_tiles.nbytes());
      EXPECT_THROW((void)ops::dequantize(q), InvalidInput);
    }
    const LinearWeight table = loader.table("model.embed_tokens", model_->info().vocab_size, model_->info().hidden_size);
    ASSERT_TRUE(table.payload<QuantizedMatrix>());
    EXPECT_FALSE(table.payload<QuantizedMatrix>()->tiles_only()) << "the embedding table reads its packed words";
  }
  if (!level_takes) GTEST_SKIP() << "this CPU level has no tile kernels for " << e.bits << " bits";
  LoadOptions keep;
  keep.device = device();
  keep.cpu_tiles_only = false;
  const std::unique_ptr<Model> kept = load_model(dir, keep);
  const std::vector<int32_t> ids = ints(ref_->get("tokens_0"));
  SequenceCache c1 = model_->make_cache({}), c2 = kept->make_cache({});
  const Array a = to_cpu(model_->forward(tokens_of(ids), c1, true)), b = to_cpu(kept->forward(tokens_of(ids), c2, true));
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "prefill logits differ";
  const Array da = to_cpu(model_->forward(tokens_of({ids[0]}), c1, false));
  const Array db = to_cpu(kept->forward(tokens_of({ids[0]}), c2, false));
  EXPECT_EQ(std::memcmp(da.raw(), db.raw(), da.nbytes()), 0) << "decode logits differ";
}

TEST_P(QuantReference, KVWriteSwitchGivesByteIdenticalGreedyOutput) {
  const std::string args = "generate -m " + fixture(GetParam().model).string() + " --device " + GetParam().device +
                           " --token-ids 5,99,23,311,8,140,77,3 -n 300 --ignore-eos --json";
  nlohmann::json jon, joff;
  ASSERT_NO_FATAL_FAILURE(testing::expect_kv_write_switch_keeps_tokens(args, 300, jon, joff));
  EXPECT_GT(jon["timings"]["kv_inplace_writes"].get<uint64_t>(), 0u);
  EXPECT_EQ(joff["timings"]["kv_inplace_writes"].get<uint64_t>(), 0u);
}

TEST_P(QuantReference, GreedyOutputEqualsTheCpuEngine) {
  if (!on_cuda()) GTEST_SKIP() << "compares the CUDA engine with the CPU's";
  const std::vector<int32_t> prompt = ints(ref_->get("greedy_prompt_1"));
  auto cpu = load_model(fixture(GetParam().model));
  GenerateParams gp;
  gp.max_tokens = 32;
  SequenceCache c1 = model_->make_cache({}), c2 = cpu->make_cache({});
  const auto gpu_tokens = generate(*model_, c1, prompt, gp).tokens;
  const auto cpu_tokens = generate(*cpu, c2, prompt, gp).tokens;
  const float* margins = ref_->get("greedy_margins_1").data<float>();
  for (size_t s = 0; s < gpu_tokens.size() && margins[s] > 0.05f; ++s)
    ASSERT_EQ(gpu_tokens[s], cpu_tokens[s]) << "step " << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantReference, OSPREY_MODELS_ON_DEVICES(testing::kQuantFixtures));

// ---------------------------------------------------------------------------------------
// Malformed quantized checkpoints, made from the llama-q4 fixture with one thing changed.

namespace {

using Tensors = std::vector<std::pair<std::string, Array>>;

class MalformedQuant : public ::testing::Test {
 protected:
  void SetUp() override {
    const SafeTensors st = SafeTensors::open(fixture("llama-q4"));
    for (const auto& name : st.names()) tensors_.emplace_back(name, ops::cast(st.get(name), st.get(name).dtype()));
    config_ = nlohmann::json::parse(testing::read_file(fixture("llama-q4") / "config.json"));
  }

  void replace(const std::string& name, const Array& a) {
    for (auto& [n, t] : tensors_)
      if (n == name) t = a;
  }
  void remove(const std::string& name) {
    std::erase_if(tensors_, [&](const auto& p) { return p.first == name; });
  }

  // Writes the checkpoint and expects load_model to throw InvalidInput mentioning each needle.
  void expect_invalid(std::initializer_list<std::string> needles) {
    write_safetensors(dir_ / "model.safetensors", tensors_);
    testing::write_file(dir_ / "config.json", config_.dump());
    try {
      load_model(dir_.path());
      FAIL() << "loaded without an error";
    } catch (const InvalidInput& e) {
      for (const auto& needle : needles)
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    }
  }

  TempDir dir_;
  Tensors tensors_;
  nlohmann::json config_;
};

const std::string kQ = "model.layers.0.self_attn.q_proj";  // [64, 64], 4-bit g64 in the fixture

}  // namespace

TEST_F(MalformedQuant, TheUnchangedCopyLoads) {
  write_safetensors(dir_ / "model.safetensors", tensors_);
  testing::write_file(dir_ / "config.json", config_.dump());
  EXPECT_EQ(load_model(dir_.path())->info().quant_bits, 4);
}

TEST_F(MalformedQuant, PackedWidthThatFitsNoBitCount) {
  replace(kQ + ".weight", Array::zeros({64, 10}, DType::u32));  // 10 * 32 / 64 = 5 bits
  expect_invalid({kQ + ".weight", "fits no supported bit count"});
}

TEST_F(MalformedQuant, MissingScales) {
  remove(kQ + ".scales");
  expect_invalid({kQ + ".scales", "missing"});
}

TEST_F(MalformedQuant, MissingBiases) {
  remove("model.layers.2.mlp.gate_proj.biases");
  expect_invalid({"model.layers.2.mlp.gate_proj.biases", "missing"});
}

TEST_F(MalformedQuant, GroupCountThatDoesNotDivideTheInput) {
  replace(kQ + ".scales", Array::zeros({64, 3}, DType::bf16));
  replace(kQ + ".biases", Array::zeros({64, 3}, DType::bf16));
  expect_invalid({kQ + ".scales", "do not divide"});
}

TEST_F(MalformedQuant, GroupSizeOtherThanTheConfigSays) {
  replace(kQ + ".scales", Array::zeros({64, 2}, DType::bf16));  // group 32, config: 64
  replace(kQ + ".biases", Array::zeros({64, 2}, DType::bf16));
  expect_invalid({kQ + ".weight", "group size 32", "group size 64"});
}

TEST_F(MalformedQuant, BiasesShapedUnlikeTheScales) {
  replace(kQ + ".biases", Array::zeros({64, 2}, DType::bf16));
  expect_invalid({kQ + ".biases", "must match"});
}

TEST_F(MalformedQuant, ScalesOfAnotherDtype) {
  replace(kQ + ".scales", Array::zeros({64, 1}, DType::f32));
  expect_invalid({kQ + ".scales", "float16 or bfloat16"});
}

TEST_F(MalformedQuant, OverrideThatDisagreesWithTheTensor) {
  // The fixture's layer 1 up_proj is 8-bit g32; the config now claims 4-bit g64.
  for (const char* key : {"quantization", "quantization_config"})
    config_[key]["model.layers.1.mlp.up_proj"] = {{"group_size", 64}, {"bits", 4}};
  expect_invalid({"model.layers.1.mlp.up_proj.weight", "8-bit with group size 32"});
}

TEST_F(MalformedQuant, OverrideWithUnsupportedBits) {
  config_["quantization"]["model.layers.1.mlp.up_proj"] = {{"group_size", 32}, {"bits", 5}};
  expect_invalid({"model.layers.1.mlp.up_proj", "bits"});
}

TEST_F(MalformedQuant, OverrideThatIsNeitherAnObjectNorFalse) {
  config_["quantization"]["model.layers.1.mlp.up_proj"] = 8;
  expect_invalid({"model.layers.1.mlp.up_proj", "false"});
}

TEST_F(MalformedQuant, QuantizedTensorOfAModuleMarkedFalse) {
  config_["quantization"][kQ] = false;
  expect_invalid({kQ + ".weight", "not quantized"});
}

TEST_F(MalformedQuant, DenseTensorOfAModuleWithAnOverride) {
  config_["quantization"]["model.layers.0.mlp.down_proj"] = {{"group_size", 32}, {"bits", 4}};
  expect_invalid({"model.layers.0.mlp.down_proj", "without .scales"});
}

TEST_F(MalformedQuant, Uint32WeightWithoutQuantizationInTheConfig) {
  config_.erase("quantization");
  config_.erase("quantization_config");
  expect_invalid({"model.embed_tokens.weight", "no \"quantization\""});
}

TEST_F(MalformedQuant, QuantizationConfigAloneIsEnough) {
  config_.erase("quantization");
  write_safetensors(dir_ / "model.safetensors", tensors_);
  testing::write_file(dir_ / "config.json", config_.dump());
  EXPECT_EQ(load_model(dir_.path())->info().quant_group_size, 64);
}

TEST_F(MalformedQuant, AnotherQuantizationMethodIsUnsupported) {
  config_.erase("quantization");
  config_["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  write_safetensors(dir_ / "model.safetensors", tensors_);
  testing::write_file(dir_ / "config.json", config_.dump());
  EXPECT_THROW(load_model(dir_.path()), Unsupported);
}

TEST_F(MalformedQuant, QuantizedOpsCheckTheirArguments) {
  // The op layer's own checks, independent of the loader's.
  const SafeTensors st = SafeTensors::open(fixture("llama-q4"));
  QuantizedMatrix q;
  q.packed = st.get(kQ + ".weight");
  q.scales = st.get(kQ + ".scales");
  q.biases = st.get(kQ + ".biases");
  q.bits = 4;
  q.group_size = 64;
  EXPECT_EQ(ops::linear(Array::zeros({2, 64}, DType::f32), q).shape(), (Shape{2, 64}));
  EXPECT_THROW(ops::linear(Array::zeros({2, 32}, DType::f32), q), InvalidInput);
  EXPECT_THROW(ops::linear(Array::zeros({2, 64}, DType::f32), q, Array::zeros({3}, DType::f32)), InvalidInput);
  EXPECT_THROW(ops::embedding(q, tokens_of({64})), InvalidInput);
  QuantizedMatrix bad = q;
  bad.group_size = 32;  // the scales are [64, 1]
  EXPECT_THROW(ops::linear(Array::zeros({1, 64}, DType::f32), bad), InvalidInput);
  bad = q;
  bad.bits = 5;
  EXPECT_THROW(ops::dequantize(bad), InvalidInput);
  EXPECT_THROW(ops::dequantize(q, DType::i32), InvalidInput);
}

}  // namespace osprey
