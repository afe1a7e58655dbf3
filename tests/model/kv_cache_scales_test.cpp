// A checkpoint's own k_scale / v_scale (model/kv_cache_scales.h) on the CPU.
//  - The demo model with scales calibrated here as a static min-max calibration makes them (a
//    layer's, or a layer's and head's, max |k| and |v| over the f16 cache's rows, / 448), written
//    by the fixture writer in every form the loader reads, declared as compressed-tensors'
//    kv_cache_scheme. With the fp8 cache: every stored row carries its layer's (and head's)
//    scale; layer 0's codes decode to the f16 run's keys and values within e4m3's rounding (the
//    rows hold x / scale, not x * scale); the greedy tokens follow the f16 cache's under the
//    same margin and bound as the per-row fp8 cache's (tests/model/kv_cache_types_test.cpp); the
//    in-place and copying arms (OSPREY_KV_INPLACE_WRITE=0) give bit-identical logits. A q8_0 or
//    f16 side takes no scales.
//  - Refusals by name (the llama fixture with one thing changed): a declared scheme without
//    the tensors, a layer without them, a key scale without its value scale, two forms of one
//    scale, malformed tensors, and the schemes Osprey does not read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/hub_quant.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer.h"

namespace osprey {
namespace {

using Tensors = std::vector<std::pair<std::string, Array>>;
using testing::TempDir;

std::filesystem::path demo_dir() { return testing::source_dir() / "models/demo"; }
std::filesystem::path llama_dir() { return testing::source_dir() / "tests/fixtures/models/llama"; }

// The checkpoint's tensors, copied out of the mapping; the F8_E4M3 ones named in `fp8`.
Tensors read_tensors(const std::filesystem::path& dir) {
  const SafeTensors st = SafeTensors::open(dir);
  Tensors t;
  for (const auto& name : st.names()) t.emplace_back(name, ops::cast(st.get(name), st.get(name).dtype()));
  return t;
}

// A 1-D tensor of `dt` (f32 or bf16) holding v.
Array scale_tensor(const std::vector<float>& v, DType dt) {
  Array a = Array::empty({int64_t(v.size())}, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::bf16)
      a.data<uint16_t>()[i] = f32_to_bf16(v[i]);
    else
      a.data<float>()[i] = v[i];
  }
  return a;
}

KVCacheParams cache_types(DType k, DType v, bool inplace = true) {
  KVCacheParams co;
  co.inplace = inplace;
  co.step = 16;
  co.k_type = k;
  co.v_type = v;
  return co;
}

struct Decoded {
  std::vector<std::vector<float>> logits;  // per step, the last position's row
  SequenceCache cache;
};

// The prompt at once, then `forced` one token at a time (empty: n greedy steps).
Decoded decode(Model& m, const KVCacheParams& co, const std::vector<int32_t>& prompt, const std::vector<int32_t>& forced,
           int n) {
  Decoded r{{}, m.make_cache(co)};
  const int64_t vocab = m.info().vocab_size;
  auto keep = [&](const Array& logits) {
    const float* row = logits.data<float>() + (logits.numel() - vocab);
    r.logits.emplace_back(row, row + vocab);
  };
  keep(m.forward(testing::tokens_of(prompt), r.cache, false));
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& last = r.logits.back();
    keep(m.forward(testing::tokens_of({forced.empty() ? int32_t(std::max_element(last.begin(), last.end()) - last.begin())
                                                      : forced[size_t(i)]}),
                   r.cache, false));
  }
  return r;
}

int32_t argmax(const std::vector<float>& row) { return int32_t(std::max_element(row.begin(), row.end()) - row.begin()); }

float margin(const std::vector<float>& row) {
  std::vector<float> r = row;
  std::partial_sort(r.begin(), r.begin() + 2, r.end(), std::greater<float>());
  return r[0] - r[1];
}

// Row r of head h of a [heads, cap, width] array.
const uint8_t* row_at(const Array& a, int64_t h, int64_t r) {
  return static_cast<const uint8_t*>(a.raw()) + size_t(h * a.strides()[0] + r * a.strides()[1]) * a.itemsize();
}

constexpr int kSteps = 64;
constexpr int64_t kKv = 2, kLayers = 8;

// The demo model with calibrated scales, once for the suite.
class DemoScales : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto plain = load_model(demo_dir());
    const Tokenizer tok = Tokenizer::load(demo_dir());
    prompt_ = tok.encode("Once upon a time, there was a little girl named", true);
    ref_ = new Decoded(decode(*plain, cache_types(DType::f16, DType::f16), prompt_, {}, kSteps));
    for (int i = 0; i < kSteps; ++i) tokens_.push_back(argmax(ref_->logits[size_t(i)]));
    ASSERT_EQ(ref_->cache.n_layers(), size_t(kLayers));
    // amax[layer][side][head] over the f16 run's rows.
    float amax[kLayers][2][kKv] = {};
    const int64_t n_rows = ref_->cache.offset(), hd = plain->kv_params(0).head_dim;
    for (int64_t l = 0; l < kLayers; ++l) {
      const KVState s = ref_->cache.layer(size_t(l)).snapshot();
      for (int side = 0; side < 2; ++side)
        for (int64_t h = 0; h < kKv; ++h)
          for (int64_t r = 0; r < n_rows; ++r) {
            const uint16_t* row = reinterpret_cast<const uint16_t*>(row_at(side ? s.values : s.keys, h, r));
            for (int64_t d = 0; d < hd; ++d) amax[l][side][h] = std::max(amax[l][side][h], std::fabs(f16_to_f32(row[d])));
          }
    }
    // The forms, two layers each: per tensor (f32 [1]); per head (f32 [2]); ModelOpt's names
    // (bf16 [2]); compressed-tensors' raw output_scale (f32 [1]); and layer 7 the older kv_scale.
    Tensors t = read_tensors(demo_dir());
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      const bool per_head = l >= 2 && l < 6;
      const DType dt = l == 4 || l == 5 ? DType::bf16 : DType::f32;
      std::vector<float> s[2];
      for (int side = 0; side < 2; ++side) {
        for (int64_t h = 0; h < kKv; ++h) s[side].push_back(amax[l][side][h] / 448.0f);
        if (!per_head) s[side] = {std::max(s[side][0], s[side][1])};
      }
      if (l == 7) s[0] = s[1] = {std::max(s[0][0], s[1][0])};
      for (int side = 0; side < 2; ++side) {
        for (float& x : s[side])
          if (dt == DType::bf16) x = bf16_to_f32(f32_to_bf16(x));
        for (int64_t h = 0; h < kKv; ++h) want_[l][side][h] = s[side][per_head ? size_t(h) : 0];
      }
      const Array ks = scale_tensor(s[0], dt), vs = scale_tensor(s[1], dt);
      if (l < 4) {
        t.emplace_back(p + "k_scale", ks);
        t.emplace_back(p + "v_scale", vs);
      } else if (l < 6) {
        t.emplace_back(p + "k_proj.k_scale", ks);
        t.emplace_back(p + "v_proj.v_scale", vs);
      } else if (l == 6) {
        t.emplace_back(p + "k_proj.output_scale", ks);
        t.emplace_back(p + "v_proj.output_scale", vs);
      } else {
        t.emplace_back(p + "kv_scale", ks);
      }
    }
    write_safetensors(*dir_ / "model.safetensors", t);
    nlohmann::json config = nlohmann::json::parse(testing::read_file(demo_dir() / "config.json"));
    config["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"config_groups", nlohmann::json::object()},
        {"kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}, {"strategy", "attn_head"}, {"dynamic", false}}}};
    testing::write_file(*dir_ / "config.json", config.dump());
    model_ = load_model(dir_->path()).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete ref_;
    delete dir_;
  }

  static inline TempDir* dir_ = nullptr;
  static inline Model* model_ = nullptr;
  static inline Decoded* ref_ = nullptr;
  static inline std::vector<int32_t> prompt_, tokens_;
  static inline float want_[kLayers][2][kKv] = {};  // [layer][keys, values][head]: the checkpoint's scale
};

TEST_F(DemoScales, StoredRowsCarryTheScalesAndHoldXOverTheScale) {
  Decoded got = decode(*model_, cache_types(DType::fp8_e4m3, DType::fp8_e4m3), prompt_, tokens_, kSteps);
  const int64_t n_rows = got.cache.offset(), hd = model_->kv_params(0).head_dim;
  ASSERT_EQ(n_rows, ref_->cache.offset());
  for (int64_t l = 0; l < kLayers; ++l) {
    const KVState s = got.cache.layer(size_t(l)).snapshot();
    for (int side = 0; side < 2; ++side)
      for (int64_t h = 0; h < kKv; ++h)
        for (int64_t r = 0; r < n_rows; ++r) {
          float scale;
          std::memcpy(&scale, row_at(side ? s.values : s.keys, h, r), 4);
          ASSERT_EQ(scale, want_[l][side][h]) << "layer " << l << (side ? " values" : " keys") << ", head " << h
                                              << ", row " << r;
        }
  }
  // Layer 0's keys and values are computed from the tokens alone, so they are the f16 run's:
  // decoded, each is within e4m3's rounding (half of 2^-3 relative, or half the subnormal step
  // 2^-9 * scale) of the f16 row, plus f16's own rounding (2^-11 relative).
  const KVState fixed = got.cache.layer(0).snapshot();
  const KVState f16 = ref_->cache.layer(0).snapshot();
  int64_t checked = 0;
  for (int side = 0; side < 2; ++side)
    for (int64_t h = 0; h < kKv; ++h)
      for (int64_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = row_at(side ? fixed.values : fixed.keys, h, r);
        const uint16_t* want = reinterpret_cast<const uint16_t*>(row_at(side ? f16.values : f16.keys, h, r));
        const float s = want_[0][side][h];
        for (int64_t d = 0; d < hd; ++d) {
          const double x = f16_to_f32(want[d]), y = double(s) * double(e4m3_to_float(row[4 + d]));
          ASSERT_LE(std::fabs(y - x), 0.0625 * std::fabs(x) + double(s) / 1024.0 + std::fabs(x) / 1024.0)
              << (side ? "values" : "keys") << ", head " << h << ", row " << r << ", element " << d;
          ++checked;
        }
      }
  EXPECT_EQ(checked, 2 * kKv * n_rows * hd);
}

TEST_F(DemoScales, GreedyTokensFollowTheF16CacheWithinTheFp8Bound) {
  // kv_cache_types_test.cpp's bound and margin for the per-row fp8 cache: the largest logit
  // change under 0.02 of the f16 row's range, and every step whose f16 margin is at least 0.5
  // keeps its token.
  constexpr float kMargin = 0.5f;
  Decoded got = decode(*model_, cache_types(DType::fp8_e4m3, DType::fp8_e4m3), prompt_, tokens_, kSteps);
  int checked = 0;
  double worst = 0.0;
  for (size_t i = 0; i < ref_->logits.size(); ++i) {
    worst = std::max(worst, testing::relative_row_error(got.logits[i].data(), ref_->logits[i].data(),
                                                        int64_t(ref_->logits[i].size())));
    if (margin(ref_->logits[i]) < kMargin) continue;
    ++checked;
    EXPECT_EQ(argmax(got.logits[i]), argmax(ref_->logits[i])) << "step " << i;
  }
  EXPECT_GE(checked, kSteps / 2);
  EXPECT_LT(worst, 0.02);
  std::printf("[ kv scales ] fixed fp8 scales: %d steps with f16 margin >= %.2f checked; largest logit change %.4f of "
              "the row's range\n",
              checked, double(kMargin), worst);
}

TEST_F(DemoScales, InPlaceAndCopyingArmsGiveIdenticalLogits) {
  for (DType vt : {DType::fp8_e4m3, DType::q8_0}) {
    Decoded on = decode(*model_, cache_types(DType::fp8_e4m3, vt, true), prompt_, {}, 40);
    Decoded off = decode(*model_, cache_types(DType::fp8_e4m3, vt, false), prompt_, {}, 40);
    ASSERT_EQ(on.logits.size(), off.logits.size());
    for (size_t i = 0; i < on.logits.size(); ++i)
      ASSERT_EQ(std::memcmp(on.logits[i].data(), off.logits[i].data(), on.logits[i].size() * sizeof(float)), 0)
          << dtype_name(vt) << " values: step " << i;
    EXPECT_GT(on.cache.counters().n_inplace_writes, 0u);
    EXPECT_EQ(off.cache.counters().n_inplace_writes, 0u);
  }
}

TEST_F(DemoScales, OnlyAnFp8SideTakesTheScales) {
  for (int64_t l = 0; l < kLayers; ++l) {
    const KVCacheParams both = model_->kv_params(l, cache_types(DType::fp8_e4m3, DType::fp8_e4m3));
    ASSERT_EQ(both.k_scales.size(), l >= 2 && l < 6 ? size_t(kKv) : size_t(1)) << "layer " << l;
    EXPECT_EQ(both.k_scales[0], want_[l][0][0]) << "layer " << l;
    EXPECT_EQ(both.v_scales.back(), want_[l][1][kKv - 1]) << "layer " << l;
    const KVCacheParams mixed = model_->kv_params(l, cache_types(DType::q8_0, DType::fp8_e4m3));
    EXPECT_TRUE(mixed.k_scales.empty()) << "layer " << l;
    EXPECT_EQ(mixed.v_scales, both.v_scales) << "layer " << l;
    const KVCacheParams plain = model_->kv_params(l, cache_types(DType::f16, DType::bf16));
    EXPECT_TRUE(plain.k_scales.empty() && plain.v_scales.empty()) << "layer " << l;
  }
}

// The llama fixture (3 layers, 2 kv heads) with scales, changed one thing at a time.
class BadScales : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ = read_tensors(llama_dir());
    config_ = nlohmann::json::parse(testing::read_file(llama_dir() / "config.json"));
    for (int l = 0; l < 3; ++l) {
      tensors_.emplace_back(name(l, "k_scale"), scale_tensor({0.01f}, DType::f32));
      tensors_.emplace_back(name(l, "v_scale"), scale_tensor({0.02f, 0.03f}, DType::f32));
    }
  }
  static std::string name(int layer, const std::string& what) {
    return "model.layers." + std::to_string(layer) + ".self_attn." + what;
  }
  void remove(const std::string& n) {
    std::erase_if(tensors_, [&](const auto& p) { return p.first == n; });
  }
  void replace(const std::string& n, const Array& a) {
    for (auto& [m, t] : tensors_)
      if (m == n) t = a;
  }
  void declare(const nlohmann::json& scheme) {
    config_["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                      {"format", "float-quantized"},
                                      {"config_groups", nlohmann::json::object()},
                                      {"kv_cache_scheme", scheme}};
  }
  std::unique_ptr<Model> load() {
    write_safetensors(dir_ / "model.safetensors", tensors_);
    testing::write_file(dir_ / "config.json", config_.dump());
    return load_model(dir_.path());
  }
  // load() throws E mentioning each needle.
  template <class E>
  void expect_refused(std::initializer_list<std::string> needles) {
    try {
      load();
      FAIL() << "loaded without an error";
    } catch (const E& e) {
      for (const auto& needle : needles)
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    }
  }

  TempDir dir_;
  Tensors tensors_;
  nlohmann::json config_;
};

const nlohmann::json kStatic = {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}};

TEST_F(BadScales, TheUnchangedCopyLoadsDeclaredOrNot) {
  EXPECT_EQ(load()->kv_params(1, cache_types(DType::fp8_e4m3, DType::fp8_e4m3)).v_scales,
            (std::vector<float>{0.02f, 0.03f}));
  declare(kStatic);
  EXPECT_EQ(load()->kv_params(2, cache_types(DType::fp8_e4m3, DType::f16)).k_scales, std::vector<float>{0.01f});
}

TEST_F(BadScales, ADeclaredSchemeWithoutTheTensors) {
  for (int l = 0; l < 3; ++l) {
    remove(name(l, "k_scale"));
    remove(name(l, "v_scale"));
  }
  EXPECT_FALSE(load()->kv_params(0, cache_types(DType::fp8_e4m3, DType::fp8_e4m3)).k_scales.size());
  declare(kStatic);
  expect_refused<InvalidInput>({"kv_cache_scheme", "model.layers.0.self_attn.k_scale"});
}

TEST_F(BadScales, ALayerWithoutThem) {
  remove(name(1, "k_scale"));
  remove(name(1, "v_scale"));
  expect_refused<InvalidInput>({"model.layers.1.self_attn.k_scale is missing"});
}

TEST_F(BadScales, AKeyScaleWithoutItsValueScale) {
  remove(name(2, "v_scale"));
  expect_refused<InvalidInput>({"model.layers.2.self_attn.v_scale is missing"});
}

TEST_F(BadScales, TwoFormsOfOneScale) {
  tensors_.emplace_back(name(0, "kv_scale"), scale_tensor({0.5f}, DType::f32));
  expect_refused<InvalidInput>({"both model.layers.0.self_attn.k_scale and model.layers.0.self_attn.kv_scale"});
}

TEST_F(BadScales, NeitherOneValueNorOnePerKvHead) {
  replace(name(1, "k_scale"), scale_tensor({0.1f, 0.2f, 0.3f}, DType::f32));
  expect_refused<InvalidInput>({"model.layers.1.self_attn.k_scale holds 3 values", "one per kv head (2)"});
}

TEST_F(BadScales, AScaleThatIsNotFiniteAndPositive) {
  for (float bad : {0.0f, -0.5f, NAN, INFINITY}) {
    replace(name(2, "v_scale"), scale_tensor({0.02f, bad}, DType::f32));
    expect_refused<InvalidInput>({"model.layers.2.self_attn.v_scale[1]", "must be finite and greater than 0"});
  }
}

TEST_F(BadScales, AScaleThatIsNotAFloatTensor) {
  replace(name(0, "k_scale"), Array::zeros({1}, DType::i32));
  expect_refused<InvalidInput>({"model.layers.0.self_attn.k_scale must be a float32, float16 or bfloat16"});
}

TEST_F(BadScales, SchemesOspreyDoesNotReadAreRefusedByField) {
  const std::pair<nlohmann::json, std::string> cases[] = {
      {{{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", true}}, "field \"dynamic\""},
      {{{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}, {"dynamic", false}}, "\"channel\""},
      {{{"num_bits", 8}, {"type", "int"}, {"strategy", "tensor"}, {"dynamic", false}}, "only 8-bit float"},
      {{{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}}, "only 8-bit float"}};
  for (const auto& [scheme, needle] : cases) {
    declare(scheme);
    expect_refused<Unsupported>({"kv_cache_scheme", needle});
  }
}

}  // namespace
}  // namespace osprey
