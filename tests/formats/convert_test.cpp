// The conversion plan (formats/convert.h) on the llama fixture: 3 layers, hidden 64, 4 heads of
// 16 (2 kv heads), intermediate 160, vocab 512, all bfloat16. The expected counts and sizes
// are derived by hand from those shapes.
#include <gtest/gtest.h>

#include "core/error.h"
#include "formats/convert.h"
#include "support/test_util.h"

namespace osprey {
namespace {

SafeTensors llama_fixture() { return SafeTensors::open(testing::source_dir() / "tests/fixtures/models/llama"); }

size_t count_quantized(const ConvertPlan& p) {
  size_t n = 0;
  for (const ConvertStep& s : p.steps) n += s.quantize ? 1 : 0;
  return n;
}

const ConvertStep& step_of(const ConvertPlan& p, const std::string& source) {
  for (const ConvertStep& s : p.steps)
    if (s.source == source) return s;
  throw std::runtime_error("no step for " + source);
}

}  // namespace

TEST(ConvertPlan, QuantizesTheMatricesWhoseInputTheGroupDivides) {
  const SafeTensors st = llama_fixture();
  // Group 64: down_proj (160 inputs) stays dense; the 2 tables and 6 matrices per layer do not.
  const ConvertPlan g64 = plan_conversion(st, 4, 64, DType::bf16, size_t(1) << 30);
  EXPECT_EQ(g64.steps.size(), 30u);
  EXPECT_EQ(count_quantized(g64), 2u + 3u * 6u);
  EXPECT_FALSE(step_of(g64, "model.layers.1.mlp.down_proj.weight").quantize);
  EXPECT_FALSE(step_of(g64, "model.norm.weight").quantize);
  // Group 32 divides 160 too.
  const ConvertPlan g32 = plan_conversion(st, 4, 32, DType::bf16, size_t(1) << 30);
  EXPECT_EQ(count_quantized(g32), 2u + 3u * 7u);
}

TEST(ConvertPlan, QuantizedOutputsHaveThePackedAndGroupShapes) {
  const ConvertPlan p = plan_conversion(llama_fixture(), 4, 64, DType::f16, size_t(1) << 30);
  const ConvertStep& gate = step_of(p, "model.layers.0.mlp.gate_proj.weight");
  ASSERT_TRUE(gate.quantize);
  ASSERT_EQ(gate.outputs.size(), 3u);
  EXPECT_EQ(gate.outputs[0].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(gate.outputs[0].dtype, DType::u32);
  EXPECT_EQ(gate.outputs[0].shape, (Shape{160, 8}));  // 64 inputs * 4 bits / 32
  EXPECT_EQ(gate.outputs[1].name, "model.layers.0.mlp.gate_proj.scales");
  EXPECT_EQ(gate.outputs[1].dtype, DType::f16);
  EXPECT_EQ(gate.outputs[1].shape, (Shape{160, 1}));
  EXPECT_EQ(gate.outputs[2].name, "model.layers.0.mlp.gate_proj.biases");
  // A dense tensor is copied in the chosen dtype.
  const ConvertStep& down = step_of(p, "model.layers.0.mlp.down_proj.weight");
  ASSERT_EQ(down.outputs.size(), 1u);
  EXPECT_EQ(down.outputs[0].dtype, DType::f16);
  EXPECT_EQ(down.outputs[0].shape, (Shape{64, 160}));
}

TEST(ConvertPlan, TotalBytesAndShards) {
  const SafeTensors st = llama_fixture();
  // Per layer: q, o 2304 bytes each (packed 64x8 u32 + 2 x 64 bf16); k, v 1152 each; gate,
  // up 5760 each; down 20480 (dense); two norms 128 each: 39168. Tables 18432 each; the
  // final norm 128.
  const ConvertPlan one = plan_conversion(st, 4, 64, DType::bf16, size_t(1) << 30);
  EXPECT_EQ(one.total_bytes, 2u * 18432u + 3u * 39168u + 128u);
  ASSERT_EQ(one.shards.size(), 1u);
  EXPECT_EQ(one.shards[0].size(), one.steps.size());

  // A limit below every tensor: each gets a shard of its own, in order.
  const ConvertPlan each = plan_conversion(st, 4, 64, DType::bf16, 1);
  ASSERT_EQ(each.shards.size(), each.steps.size());
  for (size_t i = 0; i < each.shards.size(); ++i) EXPECT_EQ(each.shards[i], std::vector<size_t>{i});

  // 40000 bytes: every shard stays within it, and the shards cover the steps in order.
  const ConvertPlan some = plan_conversion(st, 4, 64, DType::bf16, 40000);
  EXPECT_GT(some.shards.size(), 1u);
  size_t next = 0;
  for (const auto& shard : some.shards) {
    size_t bytes = 0;
    for (size_t i : shard) {
      EXPECT_EQ(i, next++);
      bytes += some.steps[i].nbytes();
    }
    EXPECT_LE(bytes, 40000u);
  }
  EXPECT_EQ(next, some.steps.size());
  EXPECT_EQ(shard_file_name(0, 1), "model.safetensors");
  EXPECT_EQ(shard_file_name(1, 3), "model-00002-of-00003.safetensors");
}

TEST(ConvertPlan, RejectsUnsupportedBitsAndGroupSizes) {
  const SafeTensors st = llama_fixture();
  EXPECT_THROW(plan_conversion(st, 5, 64, DType::bf16, 1), InvalidInput);
  EXPECT_THROW(plan_conversion(st, 4, 48, DType::bf16, 1), InvalidInput);
}

TEST(ConvertPlan, DefaultDtypeIsTheSourcesSixteenBitType) {
  EXPECT_EQ(default_convert_dtype(llama_fixture()), DType::bf16);
}

}  // namespace osprey
