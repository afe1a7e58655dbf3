// The quantization methods' registry (formats/quant_method.h): which method the registry picks
// for each layout of a module's tensors under each config, the refusals of layouts no method
// reads, and the handle's dispatch, stacking and refusals by method name.
#include <gtest/gtest.h>

#include <string>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "formats/quant_method.h"
#include "formats/safetensors.h"
#include "model/linear_group.h"
#include "support/test_util.h"

namespace osprey {
namespace {

// One module per layout, [8, 64] each (the tensors' contents are not read by detection).
SafeTensors write_layouts(const testing::TempDir& d) {
  write_safetensors(d / "model.safetensors",
                    {{"dense.weight", Array::zeros({8, 64}, DType::f16)},
                     {"mlx.weight", Array::zeros({8, 64 * 4 / 32}, DType::u32)},
                     {"mlx.scales", Array::zeros({8, 1}, DType::f16)},
                     {"mlx.biases", Array::zeros({8, 1}, DType::f16)},
                     {"fp8.weight", Array::zeros({8, 64}, DType::u8)},
                     {"int.qweight", Array::zeros({64, 1}, DType::i32)}},
                    {}, {"fp8.weight"});
  return SafeTensors::open(d.path());
}

QuantConfig hub_config(HubQuantMethod method, const std::string& name) {
  QuantConfig q;
  q.hub.method = method;
  q.hub.name = name;
  q.hub.where = "config.json: quantization_config";
  q.where = q.hub.where;
  return q;
}

std::string picked(const SafeTensors& st, const QuantConfig& q, const std::string& module) {
  return quant_method_for(st, q, module).name();
}

// The message of the InvalidInput that detection throws for `module`, or "" when none.
std::string refusal(const SafeTensors& st, const QuantConfig& q, const std::string& module) {
  try {
    (void)quant_method_for(st, q, module);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "";
}

TEST(QuantMethods, RegistryPicksTheMethodOfEachLayout) {
  testing::TempDir d;
  const SafeTensors st = write_layouts(d);
  QuantConfig mlx;
  mlx.global = QuantSetting{4, 64};
  mlx.where = "config.json: quantization";
  EXPECT_EQ(picked(st, mlx, "dense"), "dense");
  EXPECT_EQ(picked(st, mlx, "mlx"), "mlx-affine");
  EXPECT_EQ(picked(st, QuantConfig{}, "mlx"), "mlx-affine") << "detected by its tensors; its load refuses the config";
  // A GGUF checkpoint's repacked module is its block type's.
  QuantConfig gguf = mlx;
  gguf.gguf_types["mlx"] = "Q4_K";
  EXPECT_EQ(picked(st, gguf, "mlx"), "Q4_K");
  gguf.gguf_types["mlx"] = "Q6_K";
  EXPECT_EQ(picked(st, gguf, "mlx"), "Q6_K");
  EXPECT_EQ(picked(st, gguf, "dense"), "dense");

  const QuantConfig awq = hub_config(HubQuantMethod::awq, "awq");
  const QuantConfig gptq = hub_config(HubQuantMethod::gptq, "gptq");
  const QuantConfig fp8 = hub_config(HubQuantMethod::fp8, "compressed-tensors");
  EXPECT_EQ(picked(st, awq, "int"), "awq");
  EXPECT_EQ(picked(st, gptq, "int"), "gptq");
  EXPECT_EQ(picked(st, fp8, "fp8"), "fp8");
  // A hub checkpoint's unquantized layers (lm_head) stay dense.
  EXPECT_EQ(picked(st, awq, "dense"), "dense");
  EXPECT_EQ(picked(st, fp8, "dense"), "dense");
}

TEST(QuantMethods, LayoutsTheConfigDoesNotDeclareAreRefusedByName) {
  testing::TempDir d;
  const SafeTensors st = write_layouts(d);
  const std::string no_config = refusal(st, QuantConfig{}, "fp8");
  EXPECT_NE(no_config.find("tensor fp8.weight is float8_e4m3fn [8, 64]"), std::string::npos) << no_config;
  EXPECT_NE(no_config.find("no quantization_config naming an FP8 method"), std::string::npos) << no_config;
  const std::string awq_fp8 = refusal(st, hub_config(HubQuantMethod::awq, "awq"), "fp8");
  EXPECT_NE(awq_fp8.find("tensor fp8.weight is float8_e4m3fn, but config.json: quantization_config names "
                         "quant_method \"awq\""),
            std::string::npos)
      << awq_fp8;
  const std::string fp8_int = refusal(st, hub_config(HubQuantMethod::fp8, "fbgemm_fp8"), "int");
  EXPECT_NE(fp8_int.find("tensor int.qweight is an AWQ or GPTQ weight, but config.json: quantization_config names "
                         "quant_method \"fbgemm_fp8\""),
            std::string::npos)
      << fp8_int;
}

// w [3, 2] = [[1, 0], [0, 1], [1, 1]] (f32), x = [2, 5]: y = [2, 5, 7] by hand.
Array identity_and_sum() {
  Array w = Array::empty({3, 2}, DType::f32);
  const float v[] = {1, 0, 0, 1, 1, 1};
  std::copy(v, v + 6, w.data<float>());
  return w;
}

TEST(QuantMethods, HandleDispatchesToItsMethod) {
  const LinearWeight w = dense_weight(identity_and_sum());
  EXPECT_STREQ(w.method().name(), "dense");
  EXPECT_EQ(w.out_features(), 3);
  EXPECT_EQ(w.in_features(), 2);
  EXPECT_EQ(w.nbytes(), 3u * 2u * 4u);
  EXPECT_EQ(w.value_dtype(), DType::f32);
  Array x = Array::empty({1, 2}, DType::f32);
  x.data<float>()[0] = 2;
  x.data<float>()[1] = 5;
  const Array y = ops::linear(x, w);
  ASSERT_EQ(y.numel(), 3);
  EXPECT_EQ(y.data<float>()[0], 2.0f);
  EXPECT_EQ(y.data<float>()[1], 5.0f);
  EXPECT_EQ(y.data<float>()[2], 7.0f);
  EXPECT_THROW((void)ops::linear(x, LinearWeight()), InvalidInput);
}

TEST(QuantMethods, EmbeddingIsRefusedByTheMethodsWithoutOne) {
  Fp8Matrix m;
  m.codes = Array::zeros({4, 16}, DType::u8);
  m.scales = Array::zeros({4, 1}, DType::f32);
  Array ids = Array::zeros({1}, DType::i32);
  try {
    (void)ops::embedding(fp8_weight(m), ids);
    ADD_FAILURE() << "an FP8 table was looked up";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("an FP8 table is not supported"), std::string::npos) << e.what();
  }
}

TEST(QuantMethods, GroupStacksOneMethodsPartsInOrder) {
  LinearGroup g;
  g.parts = {dense_weight(identity_and_sum()), dense_weight(identity_and_sum())};
  g.biases = {Array(), Array()};
  g.outs = {3, 3};
  stack_linear_group(g);
  ASSERT_TRUE(g.is_stacked());
  EXPECT_STREQ(g.stacked.method().name(), "dense");
  EXPECT_EQ(g.stacked.out_features(), 6);
  Array x = Array::empty({1, 2}, DType::f32);
  x.data<float>()[0] = 2;
  x.data<float>()[1] = 5;
  const Array y = ops::linear(x, g.stacked);
  const float want[] = {2, 5, 7, 2, 5, 7};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y.data<float>()[i], want[i]) << i;

  // Parts of two storage kinds stay apart.
  LinearGroup mixed;
  QuantizedMatrix q;
  q.bits = 4;
  q.group_size = 32;
  q.packed = Array::zeros({3, 32 * 4 / 32}, DType::u32);
  q.scales = Array::zeros({3, 1}, DType::f16);
  q.biases = Array::zeros({3, 1}, DType::f16);
  Array wide = Array::zeros({3, 32}, DType::f32);
  mixed.parts = {dense_weight(wide), affine_weight(q)};
  mixed.biases = {Array(), Array()};
  mixed.outs = {3, 3};
  stack_linear_group(mixed);
  EXPECT_FALSE(mixed.is_stacked());
  EXPECT_EQ(mixed.parts.size(), 2u);
}

}  // namespace
}  // namespace osprey
