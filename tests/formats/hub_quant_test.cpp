// The hub's quantized checkpoint formats (formats/hub_quant.h): AWQ, GPTQ and the FP8 formats,
// written from the llama fixture by tools/make_quant_checkpoints.py (numpy, from each format's
// published layout). The loaded weights equal the script's own dequantization, the quantized
// model's logits and greedy output equal those of a plain checkpoint holding the script's
// dequantized weights, and malformed or unsupported checkpoints are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <memory>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "formats/config_reader.h"
#include "formats/hub_quant.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "model/weight_loader.h"
#include "serve/generate.h"
#include "support/device_test.h"
#include "support/family_harness.h"
#include "support/numeric.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using testing::ints;
using testing::tokens_of;

const std::vector<std::string> kFormats = {"awq",         "gptq",      "gptq-v2-8bit", "fp8-channel",
                                           "fp8-tensor",  "fp8-block", "fbgemm-fp8",   "modelopt-fp8"};

bool int_format(const std::string& f) { return f == "awq" || f.rfind("gptq", 0) == 0; }

// The script's checkpoint of format `fmt` (a folder under the returned path), written once
// per test program.
const fs::path& checkpoints(const std::string& fmt) {
  static std::map<std::string, std::unique_ptr<testing::TempDir>> made;
  std::unique_ptr<testing::TempDir>& d = made[fmt];
  if (!d) {
    d = std::make_unique<testing::TempDir>();
    // Debian's numpy is /usr/bin/python3's; OSPREY_TEST_PYTHON names another interpreter with it.
    const char* python = std::getenv("OSPREY_TEST_PYTHON");
    const std::string cmd = std::string(python ? python : "/usr/bin/python3") + " " + (testing::source_dir() / "tools/make_quant_checkpoints.py").string() +
                            " --src " + testing::fixture_dir("llama").string() + " --out " + d->path().string() +
                            " --formats " + fmt + " > " + (d->path() / "log.txt").string() + " 2>&1";
    if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << cmd << ":\n" << testing::read_file(d->path() / "log.txt");
  }
  return d->path();
}

Array to_cpu(const Array& a) { return ops::to_device(a, Device::cpu()); }

// The weight as a float32 [out, in] host matrix in the layer's input order.
// The affine codes of an AWQ or GPTQ weight (GPTQ's with its input order), or nullptr.
const QuantizedMatrix* affine_of(const LinearWeight& w) {
  if (const auto* p = w.payload<PermutedMatrix>()) return &p->q;
  return w.payload<QuantizedMatrix>();
}
Array in_perm_of(const LinearWeight& w) {
  const auto* p = w.payload<PermutedMatrix>();
  return p ? p->in_perm : Array();
}

Array dequantized(const LinearWeight& w) {
  if (const Fp8Matrix* f = w.payload<Fp8Matrix>()) {
    const Array codes = to_cpu(f->codes), scales = to_cpu(f->scales);
    const int64_t rows = codes.dim(0), cols = codes.dim(1), groups = scales.dim(1);
    Array m = Array::empty({rows, cols}, DType::f32);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        m.data<float>()[r * cols + j] = e4m3_to_float(codes.data<uint8_t>()[r * cols + j]) *
                                        scales.data<float>()[r * groups + j / (cols / groups)];
    return m;
  }
  Array m = affine_of(w) ? to_cpu(ops::dequantize(*affine_of(w), DType::f32))
                        : ops::cast(to_cpu(*w.payload<Array>()), DType::f32);
  if (!in_perm_of(w).defined()) return m;
  const Array perm = to_cpu(in_perm_of(w));
  Array out = Array::empty(m.shape(), DType::f32);
  const int64_t rows = m.dim(0), cols = m.dim(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out.data<float>()[r * cols + perm.data<int32_t>()[j]] = m.data<float>()[r * cols + j];
  return out;
}

using testing::argmax;

// (largest - second largest) logit of a row.
float margin(const float* row, int64_t n) {
  const int32_t best = argmax(row, n);
  float second = -INFINITY;
  for (int64_t j = 0; j < n; ++j)
    if (j != best) second = std::max(second, row[j]);
  return row[best] - second;
}

class HubCheckpoint : public testing::DeviceTestOf<testing::ModelCase> {
 protected:
  fs::path dir() const { return checkpoints(GetParam().model) / GetParam().model; }
  // The quantized checkpoint, its FP8 weights kept FP8 on CUDA (the path of
  // OSPREY_CUDA_FP8_WEIGHTS=1; by default they are dequantized to bf16 as on the CPU).
  std::unique_ptr<Model> load_quant() const {
    LoadOptions lo;
    lo.device = device();
    lo.keep_fp8 = true;
    return load_model(dir(), lo);
  }
};

TEST_P(HubCheckpoint, LoadedWeightsEqualTheScriptsDequantization) {
  const std::string fmt = GetParam().model;
  const SafeTensors st = SafeTensors::open(dir());
  const SafeTensors ref = SafeTensors::open_file(dir() / "dequant.safetensors");
  LoadOptions opt;
  opt.device = device();
  opt.keep_fp8 = true;
  opt.cpu_tiles_only = false;  // the weights are read back below (ops::dequantize)
  WeightLoader loader(st, opt, parse_quant_config(ConfigReader::load(dir() / "config.json")));
  ASSERT_EQ(ref.names().size(), 21u);  // q, k, v, o, gate, up, down of 3 layers
  if (!int_format(fmt)) {
    // Unless asked to keep them, FP8 weights are dequantized to bf16 at load on every device.
    LoadOptions by_default;
    by_default.device = device();
    by_default.keep_fp8 = false;
    WeightLoader dequantizing(st, by_default, parse_quant_config(ConfigReader::load(dir() / "config.json")));
    const std::string first = ref.names().front();
    const LinearWeight w = dequantizing.linear(first.substr(0, first.size() - std::string(".weight").size()),
                                               ref.get(first).dim(0), ref.get(first).dim(1));
    EXPECT_STREQ(w.method().name(), "dense") << first;
    ASSERT_TRUE(w.payload<Array>()) << first;
    EXPECT_EQ(w.payload<Array>()->dtype(), DType::bf16) << first;
  }
  for (const std::string& name : ref.names()) {
    const Array r = ref.get(name);
    const int64_t out = r.dim(0), in = r.dim(1);
    const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
    const LinearWeight w = loader.linear(prefix, out, in);
    if (int_format(fmt)) {
      ASSERT_TRUE(affine_of(w)) << name;
      EXPECT_STREQ(w.method().name(), fmt.starts_with("awq") ? "awq" : "gptq") << name;
      EXPECT_EQ(affine_of(w)->bits, fmt == "gptq-v2-8bit" ? 8 : 4) << name;
      EXPECT_EQ(affine_of(w)->group_size, 32) << name;
      EXPECT_EQ(in_perm_of(w).defined(), fmt == "gptq") << name << ": desc_act orders the inputs";
    } else if (device().is_cpu()) {
      ASSERT_TRUE(w.payload<Array>()) << name;
      EXPECT_EQ(w.payload<Array>()->dtype(), DType::bf16) << name;
    } else {
      ASSERT_TRUE(w.payload<Fp8Matrix>()) << name << ": FP8 weights stay FP8 on CUDA";
      EXPECT_STREQ(w.method().name(), "fp8") << name;
      // Unasked (LoadOptions::keep_fp8 and OSPREY_CUDA_FP8_WEIGHTS unset): kept FP8 where one
      // scale per row lets the FP8 tensor cores run it, dequantized otherwise (block scales).
      if (std::getenv("OSPREY_CUDA_FP8_WEIGHTS") == nullptr) {
        LoadOptions unasked;
        unasked.device = device();
        WeightLoader auto_loader(st, unasked, parse_quant_config(ConfigReader::load(dir() / "config.json")));
        const LinearWeight wa = auto_loader.linear(prefix, out, in);
        const bool keep = ops::fp8_tensor_cores(device()) && w.payload<Fp8Matrix>()->scales.dim(1) == 1;
        EXPECT_EQ(wa.payload<Fp8Matrix>() != nullptr, keep) << name << " (" << fmt << ")";
        EXPECT_EQ(wa.payload<Array>() != nullptr, !keep) << name << " (" << fmt << ")";
      }
    }
    const Array ours = dequantized(w);
    ASSERT_EQ(ours.shape(), r.shape()) << name;
    for (int64_t o = 0; o < out; ++o) {
      const float* a = ours.data<float>() + o * in;
      const float* b = r.data<float>() + o * in;
      float row_max = 0;
      for (int64_t i = 0; i < in; ++i) row_max = std::max(row_max, std::fabs(b[i]));
      for (int64_t i = 0; i < in; ++i) {
        // AWQ/GPTQ: bias = -s z rounded once to float16 (2^-11 of |s z| <= the row's range);
        // FP8: the product rounded to bfloat16 (2^-9 of it) on the CPU, in float32 on CUDA.
        const float tol = int_format(fmt) ? std::ldexp(row_max, -10) : std::ldexp(std::fabs(b[i]), -8);
        ASSERT_LE(std::fabs(a[i] - b[i]), tol) << name << " [" << o << ", " << i << "]";
      }
    }
  }
}

// Logits of the quantized model and of its dense twin (the script's dequantized weights as a
// float32 checkpoint) over one prompt, prefill and token by token. AWQ/GPTQ run the 4 and
// 8-bit kernels (x rounded to int8 parts: within 1e-3 of f32 activations) with float16 K/V
// rows like the twin; FP8 runs bfloat16 weights (the products rounded within 2^-9) and bfloat16
// K/V rows against the twin's float32 weights and float16 rows.
// FP8 where the FP8 tensor cores run it prefills W8A8: every linear layer's activation rows
// rounded to e4m3 (3 mantissa bits: up to 2^-4 of a value), so the prompt's bound is twice
// that (an H100 measured 0.062-0.077 over the five FP8 formats); one-row decode keeps
// unquantized activations (the GEMV) and the tighter bound.
TEST_P(HubCheckpoint, LogitsMatchTheDequantizedDenseModel) {
  const double tol = int_format(GetParam().model) ? 3e-3 : 1e-2;
  const bool w8a8 = !int_format(GetParam().model) && ops::fp8_tensor_cores(device());
  const double prompt_tol = w8a8 ? 0.125 : tol;
  auto quant = load_quant();
  auto dense = testing::load_on(dir() / "dense", device());
  const std::vector<int32_t> ids = testing::random_prompt(24, 7);
  {
    SequenceCache cq = quant->make_cache({}), cd = dense->make_cache({});
    const Array lq = testing::host_logits(*quant, ids, cq, true), ld = testing::host_logits(*dense, ids, cd, true);
    ASSERT_EQ(lq.shape(), ld.shape());
    double worst = 0;
    for (int64_t t = 0; t < ld.dim(0); ++t)
      worst = std::max(worst, testing::relative_row_error(lq.data<float>() + t * ld.dim(1),
                                                          ld.data<float>() + t * ld.dim(1), ld.dim(1)));
    EXPECT_LT(worst, prompt_tol) << GetParam().model << (w8a8 ? " (W8A8 prefill)" : "");
  }
  SequenceCache cq = quant->make_cache({}), cd = dense->make_cache({});
  double worst = 0;
  for (int32_t t : ids) {
    const Array a = to_cpu(quant->forward(tokens_of({t}), cq, false));
    const Array b = to_cpu(dense->forward(tokens_of({t}), cd, false));
    worst = std::max(worst, testing::relative_row_error(a.data<float>(), b.data<float>(), b.dim(1)));
  }
  EXPECT_LT(worst, tol) << GetParam().model << ": token-by-token decode";
}

// Greedy output of the quantized model equals the dense twin's over the steps whose margin
// (dense logits, teacher-forced) is clear. Where FP8 would prefill W8A8, batch invariance runs
// every row through the GEMV (activations unquantized): this checks the weights; W8A8's effect
// on output is measured by perplexity (docs/benchmark_results/2026-12-06-h200-fp8-w8a8.md).
TEST_P(HubCheckpoint, GreedyOutputMatchesTheDenseModelWhereMarginsAreClear) {
  struct InvariantScope {
    bool before = ops::batch_invariant();
    explicit InvariantScope(bool on) { ops::set_batch_invariant(on || before); }
    ~InvariantScope() { ops::set_batch_invariant(before); }
  } invariant(!int_format(GetParam().model) && ops::fp8_tensor_cores(device()));
  auto quant = load_quant();
  auto dense = testing::load_on(dir() / "dense", device());
  int clear = 0;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<int32_t> prompt = testing::random_prompt(8, seed);
    GenerateParams gp;
    gp.max_tokens = 32;
    SequenceCache cd = dense->make_cache({});
    const std::vector<int32_t> expected = generate(*dense, cd, prompt, gp).tokens;
    std::vector<int32_t> forced = prompt;
    forced.insert(forced.end(), expected.begin(), expected.end() - 1);
    SequenceCache cf = dense->make_cache({});
    const Array logits = testing::host_logits(*dense, forced, cf, true);
    const int64_t vocab = logits.dim(1);
    SequenceCache cq = quant->make_cache({});
    const std::vector<int32_t> got = generate(*quant, cq, prompt, gp).tokens;
    ASSERT_EQ(got.size(), expected.size());
    for (size_t s = 0; s < expected.size(); ++s) {
      const float* row = logits.data<float>() + (int64_t(prompt.size()) - 1 + int64_t(s)) * vocab;
      if (margin(row, vocab) <= 0.05f) break;
      ++clear;
      ASSERT_EQ(got[s], expected[s]) << GetParam().model << ", seed " << seed << ", step " << s;
    }
  }
  EXPECT_GE(clear, 16) << "too few clear-margin steps to check";
}

INSTANTIATE_TEST_SUITE_P(Formats, HubCheckpoint, OSPREY_MODELS_ON_DEVICES(kFormats));

TEST(HubQuantFp8, E4m3DecodesAsTheFormatDefines) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), std::ldexp(7.0f, -9));  // largest subnormal
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(e4m3_to_float(0x3a), 1.25f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);  // largest finite
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // exponent 15 is finite (no infinities)
}

// A copy of one of the script's checkpoints with one change, expected to be refused.
class HubQuantMalformed : public ::testing::Test {
 protected:
  void copy(const std::string& fmt) {
    for (const auto& e : fs::directory_iterator(checkpoints(fmt) / fmt))
      if (e.is_regular_file()) fs::copy_file(e.path(), dir_.path() / e.path().filename());
    config_ = nlohmann::json::parse(testing::read_file(dir_ / "config.json"));
  }
  void set_config() { testing::write_file(dir_ / "config.json", config_.dump()); }
  // Rewrites model.safetensors with `change` applied to its tensors.
  void rewrite(const std::function<void(std::vector<std::pair<std::string, Array>>&)>& change) {
    std::vector<std::pair<std::string, Array>> tensors;
    std::set<std::string> f8;
    {
      const SafeTensors st = SafeTensors::open(dir_.path());
      for (const std::string& n : st.names()) {
        tensors.push_back({n, ops::cast(st.get(n), st.info(n).dtype)});
        if (st.info(n).float8_e4m3) f8.insert(n);
      }
    }
    change(tensors);
    write_safetensors(dir_ / "model.safetensors", tensors, {}, f8);
  }
  template <class E>
  void expect_refused(const std::vector<std::string>& needles) {
    try {
      load_model(dir_.path());
      FAIL() << "loaded without an error";
    } catch (const E& e) {
      for (const std::string& n : needles) EXPECT_TRUE(testing::contains(e.what(), n));
    }
  }
  testing::TempDir dir_;
  nlohmann::json config_;
};

TEST_F(HubQuantMalformed, TheUnchangedCopiesLoad) {
  copy("gptq");
  EXPECT_EQ(load_model(dir_.path())->info().quant_bits, 4);
}

TEST_F(HubQuantMalformed, AwqOtherThanGemmPackingIsUnsupported) {
  copy("awq");
  config_["quantization_config"]["version"] = "gemv";
  set_config();
  expect_refused<Unsupported>({"version", "gemv"});
}

TEST_F(HubQuantMalformed, GptqCheckpointFormatOtherThanGptqIsUnsupported) {
  copy("gptq");
  config_["quantization_config"]["checkpoint_format"] = "marlin";
  set_config();
  expect_refused<Unsupported>({"checkpoint_format", "marlin"});
}

TEST_F(HubQuantMalformed, CompressedTensorsPackQuantizedIsUnsupported) {
  copy("fp8-channel");
  config_["quantization_config"]["format"] = "pack-quantized";
  set_config();
  expect_refused<Unsupported>({"format", "pack-quantized"});
}

TEST_F(HubQuantMalformed, UnknownQuantMethodIsUnsupported) {
  copy("awq");
  config_["quantization_config"]["quant_method"] = "bitsandbytes";
  set_config();
  expect_refused<Unsupported>({"quant_method", "bitsandbytes"});
}

TEST_F(HubQuantMalformed, MissingZeroPointsAreNamed) {
  copy("awq");
  rewrite([](std::vector<std::pair<std::string, Array>>& t) { std::erase_if(t, [](const auto& p) { return p.first == "model.layers.0.mlp.up_proj.qzeros"; }); });
  expect_refused<InvalidInput>({"model.layers.0.mlp.up_proj.qzeros"});
}

TEST_F(HubQuantMalformed, GroupIndexWithUnequalGroupsIsNamed) {
  copy("gptq");
  rewrite([](std::vector<std::pair<std::string, Array>>& t) {
    for (auto& [n, a] : t)
      if (n == "model.layers.1.self_attn.q_proj.g_idx") a.data<int32_t>()[0] = (a.data<int32_t>()[0] + 1) % 2;
  });
  expect_refused<InvalidInput>({"model.layers.1.self_attn.q_proj.g_idx", "32 inputs in each"});
}

TEST_F(HubQuantMalformed, Fp8ScaleOfNoKnownShapeIsNamed) {
  copy("fbgemm-fp8");
  rewrite([](std::vector<std::pair<std::string, Array>>& t) {
    for (auto& [n, a] : t)
      if (n == "model.layers.2.mlp.down_proj.weight_scale") a = Array::zeros({3, 1}, DType::f32);
  });
  expect_refused<InvalidInput>({"model.layers.2.mlp.down_proj.weight_scale"});
}

TEST_F(HubQuantMalformed, Fp8WithoutAQuantizationConfigIsNamed) {
  copy("fp8-channel");
  config_.erase("quantization_config");
  set_config();
  expect_refused<InvalidInput>({"float8_e4m3fn", "quantization_config"});
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

// `osprey convert --to fp8` writes what the script writes for compressed-tensors per-channel
// FP8 (the same scales and codes, byte for byte), and a config that names that scheme.
TEST(HubQuantConvert, Fp8ConversionEqualsTheScriptsPerChannelCheckpoint) {
  testing::TempDir out;
  const auto r = testing::run_osprey("convert -m " + testing::fixture_dir("llama").string() + " -o " +
                                     (out / "fp8").string() + " --to fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const SafeTensors ours = SafeTensors::open(out / "fp8");
  const SafeTensors ref = SafeTensors::open(checkpoints("fp8-channel") / "fp8-channel");
  ASSERT_EQ(ours.names(), ref.names());
  int n_f8 = 0;
  for (const std::string& n : ref.names()) {
    const TensorInfo &a = ours.info(n), &b = ref.info(n);
    ASSERT_EQ(a.float8_e4m3, b.float8_e4m3) << n;
    ASSERT_EQ(a.dtype, b.dtype) << n;
    ASSERT_EQ(a.shape, b.shape) << n;
    n_f8 += a.float8_e4m3 ? 1 : 0;
    const Array x = ours.get(n), y = ref.get(n);
    ASSERT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << n;
  }
  EXPECT_EQ(n_f8, 21);
  const auto cfg = nlohmann::json::parse(testing::read_file(out / "fp8" / "config.json"))["quantization_config"];
  EXPECT_EQ(cfg["quant_method"], "compressed-tensors");
  EXPECT_EQ(cfg["format"], "float-quantized");
  EXPECT_EQ(cfg["ignore"], nlohmann::json::array({"lm_head"}));
  EXPECT_EQ(cfg["config_groups"]["group_0"]["weights"]["strategy"], "channel");
  EXPECT_EQ(cfg["config_groups"]["group_0"]["input_activations"]["dynamic"], true);
  EXPECT_EQ(load_model(out / "fp8")->info().weight_dtype, DType::bf16);
}

// The activation scheme a checkpoint declares: compressed-tensors' input_activations null (or
// absent) is weights-only FP8; dynamic per-token FP8 activations are W8A8; a static or
// per-tensor scheme runs per token, with a note for the log; other types are refused by name.
TEST(HubQuantConfig, Fp8ActivationSchemeIsReadAsDeclared) {
  auto parse = [](const nlohmann::json& acts, bool with_key = true) {
    nlohmann::json group = {{"targets", {"Linear"}},
                            {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}}};
    if (with_key) group["input_activations"] = acts;
    const nlohmann::json c = {{"quant_method", "compressed-tensors"},
                              {"format", "float-quantized"},
                              {"config_groups", {{"group_0", group}}}};
    return parse_hub_quant(ConfigReader(c, "config.json: quantization_config"), "compressed-tensors");
  };
  const HubQuant none = parse(nullptr);
  EXPECT_FALSE(none.fp8_activations);
  EXPECT_EQ(none.fp8_activation_note, "");
  EXPECT_FALSE(parse(nullptr, false).fp8_activations);
  const HubQuant token =
      parse({{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}, {"symmetric", true}});
  EXPECT_TRUE(token.fp8_activations);
  EXPECT_EQ(token.fp8_activation_note, "");
  const HubQuant stat = parse({{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}});
  EXPECT_TRUE(stat.fp8_activations);
  EXPECT_NE(stat.fp8_activation_note.find("static tensor"), std::string::npos) << stat.fp8_activation_note;
  EXPECT_THROW(parse({{"num_bits", 4}, {"type", "int"}, {"strategy", "token"}, {"dynamic", true}}), Unsupported);
  const nlohmann::json fp8 = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  EXPECT_TRUE(parse_hub_quant(ConfigReader(fp8, "q"), "fp8").fp8_activations);
  const nlohmann::json bad = {{"quant_method", "fp8"}, {"activation_scheme", "sometimes"}};
  EXPECT_THROW(parse_hub_quant(ConfigReader(bad, "q"), "fp8"), InvalidInput);
}

// convert --to fp8 --fp8-activations none writes a weights-only checkpoint (input_activations
// null) of the same tensors; it loads as weights-only; the option is refused for other targets.
TEST(HubQuantConvert, Fp8WeightsOnlyConversionDeclaresNoActivations) {
  testing::TempDir out;
  const auto r = testing::run_osprey("convert -m " + testing::fixture_dir("llama").string() + " -o " +
                                     (out / "fp8").string() + " --to fp8 --fp8-activations none");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto cfg = nlohmann::json::parse(testing::read_file(out / "fp8" / "config.json"))["quantization_config"];
  ASSERT_TRUE(cfg["config_groups"]["group_0"].contains("input_activations"));
  EXPECT_TRUE(cfg["config_groups"]["group_0"]["input_activations"].is_null());
  const ConfigReader qc(cfg, "quantization_config");
  EXPECT_FALSE(parse_hub_quant(qc, "compressed-tensors").fp8_activations);
  const auto bad = testing::run_osprey("convert -m " + testing::fixture_dir("llama").string() + " -o " +
                                       (out / "mlx").string() + " --fp8-activations none");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--fp8-activations applies to --to fp8 only"), std::string::npos) << bad.err;
  const auto junk = testing::run_osprey("convert -m " + testing::fixture_dir("llama").string() + " -o " +
                                        (out / "x").string() + " --to fp8 --fp8-activations sometimes");
  EXPECT_NE(junk.exit_code, 0);
  EXPECT_NE(junk.err.find("--fp8-activations"), std::string::npos) << junk.err;
}

TEST(HubQuantConvert, Fp8RefusesTheMlxOptionsAndUnknownTargets) {
  testing::TempDir out;
  const std::string m = "convert -m " + testing::fixture_dir("llama").string() + " -o " + (out / "x").string();
  auto r = testing::run_osprey(m + " --to fp8 --q-bits 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(testing::contains(r.err, "--q-bits"));
  r = testing::run_osprey(m + " --to int3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(testing::contains(r.err, "int3"));
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(HubQuantConfig, MlxTensorsUnderAHubMethodAreNamed) {
  testing::TempDir dir;
  for (const auto& e : fs::directory_iterator(testing::fixture_dir("llama-q4")))
    fs::copy_file(e.path(), dir.path() / e.path().filename());
  auto config = nlohmann::json::parse(testing::read_file(dir / "config.json"));
  config.erase("quantization");
  config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
  testing::write_file(dir / "config.json", config.dump());
  try {
    load_model(dir.path());
    FAIL() << "loaded without an error";
  } catch (const InvalidInput& e) {
    EXPECT_TRUE(testing::contains(e.what(), "MLX-quantized"));
    EXPECT_TRUE(testing::contains(e.what(), "gptq"));
  }
}

}  // namespace
}  // namespace osprey
