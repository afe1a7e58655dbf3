// osprey convert: its output against the torch reference quantizer's checkpoints
// (tools/mlx_quant_reference.py -> tests/fixtures/models/*-q*), sharding, and bad input
// through the CLI (non-zero exit, a message naming the flag, file or tensor).
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "support/test_util.h"

namespace osprey {
namespace {

namespace fs = std::filesystem;
using testing::run_osprey;
using testing::TempDir;

fs::path fixture(const std::string& name) { return testing::source_dir() / "tests/fixtures/models" / name; }

void expect_error(const testing::CommandResult& r, const std::string& needle, int code = 1) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
}

std::string convert(const fs::path& src, const fs::path& dst, const std::string& flags) {
  return "convert -m " + src.string() + " -o " + dst.string() + " " + flags;
}

bool same_bytes(const Array& a, const Array& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every tensor of `ref` equals ours byte for byte (u32 codes, scales, biases and the dense
// tensors), except those of the modules in `skip_modules` (the reference's per-layer overrides).
void expect_same_tensors(const fs::path& ours_dir, const fs::path& ref_dir, const std::vector<std::string>& skip_modules) {
  const SafeTensors ours = SafeTensors::open(ours_dir), ref = SafeTensors::open(ref_dir);
  auto kept = [&](const SafeTensors& st) {
    std::vector<std::string> names;
    for (const auto& name : st.names())
      if (std::find(skip_modules.begin(), skip_modules.end(), name.substr(0, name.rfind('.'))) == skip_modules.end())
        names.push_back(name);
    return names;
  };
  ASSERT_EQ(kept(ours), kept(ref));
  int compared = 0;
  for (const auto& name : kept(ref)) {
    EXPECT_TRUE(same_bytes(ours.get(name), ref.get(name)))
        << name << ": ours " << describe(ours.get(name)) << ", reference " << describe(ref.get(name));
    ++compared;
  }
  EXPECT_GT(compared, 20);
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(testing::read_file(p)); }

}  // namespace

TEST(CliConvert, EightBitLlamaWithFloat16ScalesEqualsTheReferenceQuantizer) {
  TempDir d;
  const fs::path out = d / "q8";
  auto r = run_osprey(convert(fixture("llama"), out, "--q-bits 8 --q-group-size 64 --dtype float16"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_tensors(out, fixture("llama-q8"), {});
  const auto cfg = read_json(out / "config.json");
  const nlohmann::json q = {{"group_size", 64}, {"bits", 8}};
  EXPECT_EQ(cfg["quantization"], q);
  EXPECT_EQ(cfg["quantization_config"], q);
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["rope_parameters"], read_json(fixture("llama") / "config.json")["rope_parameters"]);
  EXPECT_TRUE(fs::exists(out / "generation_config.json"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  // down_proj (160 inputs) is left dense: 64 does not divide 160.
  const SafeTensors st = SafeTensors::open(out);
  EXPECT_EQ(st.info("model.layers.0.mlp.down_proj.weight").dtype, DType::f16);
  EXPECT_EQ(st.info("model.norm.weight").dtype, DType::f16);
  EXPECT_EQ(cfg["dtype"], "float16");
  EXPECT_FALSE(st.contains("model.layers.0.mlp.down_proj.scales"));
  EXPECT_EQ(st.info("lm_head.weight").dtype, DType::u32);
  EXPECT_EQ(st.info("model.embed_tokens.weight").dtype, DType::u32);
}

TEST(CliConvert, FourBitLlamaEqualsTheReferenceOutsideItsOverride) {
  TempDir d;
  auto r = run_osprey(convert(fixture("llama"), d / "q4", "--q-bits 4 --q-group-size 64 --dtype bfloat16"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_tensors(d / "q4", fixture("llama-q4"), {"model.layers.1.mlp.up_proj"});
}

TEST(CliConvert, TiedQwen2EqualsTheReferenceOutsideItsOverrides) {
  TempDir d;
  auto r = run_osprey(convert(fixture("qwen2"), d / "q4", "--q-bits 4 --q-group-size 32"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const SafeTensors st = SafeTensors::open(d / "q4");
  EXPECT_FALSE(st.contains("lm_head.weight"));
  EXPECT_EQ(st.info("model.layers.0.self_attn.q_proj.bias").dtype, DType::bf16);
  EXPECT_EQ(st.info("model.embed_tokens.weight").dtype, DType::u32);
  // The reference leaves layer 1's o_proj dense and makes layer 0's gate_proj 6-bit.
  expect_same_tensors(d / "q4", fixture("qwen2-q4"),
                      {"model.layers.0.mlp.gate_proj", "model.layers.1.self_attn.o_proj"});
}

TEST(CliConvert, ConvertedModelLoadsAndGenerates) {
  TempDir d;
  auto r = run_osprey(convert(fixture("llama"), d / "q4", "--q-bits 4 --q-group-size 32"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("Q4 g32"), std::string::npos) << r.err;
  auto model = load_model(d / "q4");
  EXPECT_EQ(model->info().quant_bits, 4);
  EXPECT_EQ(model->info().quant_group_size, 32);
  auto g = run_osprey("generate -m " + (d / "q4").string() + " --token-ids 5,99,23 -n 8 --ignore-eos --json");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out)["tokens"].size(), 8u);
}

TEST(CliConvert, LargeCheckpointsAreShardedWithAnIndex) {
  TempDir d;
  auto cfg = testing::tiny_llama_config();
  cfg["vocab_size"] = 8192;
  cfg["hidden_size"] = 128;
  cfg["intermediate_size"] = 256;
  testing::write_tiny_llama(d / "src", cfg);
  // Embedding and head: 8192 x 128 at 8 bits, about 1.1 MiB each with their scales.
  auto r = run_osprey(convert(d / "src", d / "sharded", "--q-bits 8 --q-group-size 64 --max-shard-mib 1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_osprey(convert(d / "src", d / "single", "--q-bits 8 --q-group-size 64"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto index = read_json(d / "sharded" / "model.safetensors.index.json");
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  ASSERT_GE(files.size(), 3u);
  const std::string n = std::to_string(files.size());
  EXPECT_EQ(*files.begin(), "model-00001-of-0000" + n + ".safetensors");
  size_t total = 0;
  for (const auto& f : files) {
    EXPECT_TRUE(fs::exists(d / "sharded" / f)) << f;
    EXPECT_LE(fs::file_size(d / "sharded" / f), (size_t(1) << 20) + (size_t(1) << 20)) << f;  // one tensor may pass 1 MiB
  }
  const SafeTensors st = SafeTensors::open(d / "sharded");
  for (const auto& name : st.names()) total += st.info(name).nbytes;
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  expect_same_tensors(d / "sharded", d / "single", {});
  EXPECT_EQ(load_model(d / "sharded")->info().quant_bits, 8);
}

TEST(CliConvert, RefusesANonEmptyOutputFolder) {
  TempDir d;
  testing::write_file(d / "keep.txt", "x");
  expect_error(run_osprey(convert(fixture("llama"), d.path(), "")), "-o " + d.path().string());
  EXPECT_TRUE(fs::exists(d / "keep.txt"));
}

TEST(CliConvert, RefusesAnAlreadyQuantizedSource) {
  TempDir d;
  expect_error(run_osprey(convert(fixture("llama-q4"), d / "out", "")), "already quantized");
  EXPECT_FALSE(fs::exists(d / "out"));
}

TEST(CliConvert, RejectsUnsupportedSettingsNamingTheFlag) {
  TempDir d;
  // Values out of range are usage errors (exit 2).
  expect_error(run_osprey(convert(fixture("llama"), d / "a", "--q-bits 5")), "--q-bits: 5 is not supported", 2);
  expect_error(run_osprey(convert(fixture("llama"), d / "b", "--q-group-size 48")), "--q-group-size: 48 is not supported", 2);
  expect_error(run_osprey(convert(fixture("llama"), d / "c", "--dtype float8")), "--dtype: \"float8\" is not supported", 2);
  expect_error(run_osprey(convert(fixture("llama"), d / "c", "--dtype float32")), "--dtype: \"float32\" is not supported", 2);
  expect_error(run_osprey(convert(fixture("llama"), d / "c", "--max-shard-mib 0")), "--max-shard-mib: 0 is out of range", 2);
  // 2^44 MiB would wrap to 0 bytes if shifted unchecked.
  expect_error(run_osprey(convert(fixture("llama"), d / "c", "--max-shard-mib 17592186044416")),
               "--max-shard-mib: 17592186044416 is out of range", 2);
  expect_error(run_osprey(convert(d / "missing", d / "e", "")), "-m " + (d / "missing").string());
  EXPECT_EQ(run_osprey("convert -m " + fixture("llama").string()).exit_code, 2);  // no -o
  EXPECT_FALSE(fs::exists(d / "a"));
}

TEST(CliConvert, MalformedQuantizedCheckpointFailsToGenerateWithTheTensorNamed) {
  TempDir d;
  const SafeTensors st = SafeTensors::open(fixture("llama-q4"));
  std::vector<std::pair<std::string, Array>> tensors;
  for (const auto& name : st.names())
    if (name != "model.layers.2.self_attn.v_proj.scales") tensors.emplace_back(name, st.get(name));
  write_safetensors(d / "model.safetensors", tensors);
  fs::copy_file(fixture("llama-q4") / "config.json", d / "config.json");
  expect_error(run_osprey("generate -m " + d.path().string() + " --token-ids 1,2,3 -n 2"),
               "model.layers.2.self_attn.v_proj.scales");
}

}  // namespace osprey
