// Families from GGUF files: each fixture checkpoint converted to GGUF as llama.cpp's converter
// lays it out (tools/make_gguf_fixtures.py: renamed tensors, Llama's permuted q/k rows,
// Gemma's 1 + w norms, Llama 3's rope factors as a tensor) loads through the same family code
// and matches transformers' logits on the safetensors original (reference.safetensors) as
// closely as the safetensors checkpoint does, with the same greedy tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/gguf.h"
#include "formats/gguf_model.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "serve/generate.h"
#include "support/gguf_bytes.h"
#include "support/test_util.h"

namespace osprey {
namespace {

using testing::error_of;

using testing::ints;
using testing::relative_row_error;
using testing::tokens_of;

std::filesystem::path gguf_fixture(const std::string& family) {
  return testing::source_dir() / "tests/fixtures/gguf" / (family + ".gguf");
}
std::filesystem::path st_fixture(const std::string& family) {
  return testing::source_dir() / "tests/fixtures/models" / family;
}

// The bound tests/model/reference_test.cpp holds the safetensors checkpoints to on the CPU.
double logits_bound(const std::string& family, DType kv_rows) {
  if (family == "gemma3" || family == "cohere2") return kv_rows == DType::bf16 ? 2.5e-2 : 3e-3;
  return 1e-3;
}

class GgufFamily : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(GgufFamily, LogitsMatchTransformersAndTheSafetensorsCheckpoint) {
  const std::string family = GetParam();
  std::unique_ptr<Model> gguf = load_model(gguf_fixture(family));
  std::unique_ptr<Model> st = load_model(st_fixture(family));
  EXPECT_EQ(gguf->info().model_type, st->info().model_type);
  EXPECT_EQ(gguf->info().n_layers, st->info().n_layers);
  EXPECT_EQ(gguf->info().eos_ids, st->info().eos_ids);
  EXPECT_EQ(gguf->info().bos_id, st->info().bos_id);
  const SafeTensors ref = SafeTensors::open_file(st_fixture(family) / "reference.safetensors");
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> ids = ints(ref.get("tokens_" + std::to_string(i)));
    Array want = ref.get("logits_" + std::to_string(i));
    const int64_t vocab = want.dim(1);
    SequenceCache cg = gguf->make_cache({}), cs = st->make_cache({});
    Array ours = gguf->forward(tokens_of(ids), cg, true);
    Array theirs = st->forward(tokens_of(ids), cs, true);
    ASSERT_EQ(ours.shape(), want.shape());
    const double bound = logits_bound(family, cg.snapshot()[0].keys.dtype());
    double vs_ref = 0, vs_st = 0;
    for (int64_t t = 0; t < want.dim(0); ++t) {
      vs_ref = std::max(vs_ref, relative_row_error(ours.data<float>() + t * vocab, want.data<float>() + t * vocab, vocab));
      vs_st = std::max(vs_st, relative_row_error(ours.data<float>() + t * vocab, theirs.data<float>() + t * vocab, vocab));
    }
    EXPECT_LT(vs_ref, bound) << family << " sequence " << i;
    // The same weights through the same code: only the rounding of the few values the file
    // holds otherwise (f32 norm epsilon and rope base, the rope factors) may differ.
    EXPECT_LT(vs_st, 1e-4) << family << " sequence " << i;
  }
}

TEST_P(GgufFamily, GreedyOutputEqualsTheSafetensorsCheckpoint) {
  const std::string family = GetParam();
  std::unique_ptr<Model> gguf = load_model(gguf_fixture(family));
  std::unique_ptr<Model> st = load_model(st_fixture(family));
  const SafeTensors ref = SafeTensors::open_file(st_fixture(family) / "reference.safetensors");
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> prompt = ints(ref.get("greedy_prompt_" + std::to_string(i)));
    GenerateParams gp;
    gp.max_tokens = 32;
    SequenceCache cg = gguf->make_cache({}), cs = st->make_cache({});
    EXPECT_EQ(generate(*gguf, cg, prompt, gp).tokens, generate(*st, cs, prompt, gp).tokens) << family << " prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GgufFamily,
                         ::testing::Values("llama", "qwen2", "qwen3", "gemma3", "cohere2", "mistral"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The llama fixture quantized to Q8_0 and Q4_0 by llama.cpp's reference quantizers
// (tools/make_gguf_fixtures.py): the quantized model stays close to transformers' logits of
// the bf16 original, and Q8_0 closer than Q4_0. The weights' own rounding (0.5% of their RMS
// at Q8_0) moves this random model's logits by about 2% of their range at Q8_0 and 24% at Q4_0;
// the bounds are twice and 1.7 times that. Each block's values are checked exactly by the
// test above; this one checks the whole model's wiring (mixed settings, quantized embedding
// and head).
TEST(GgufModel, QuantizedFilesStayCloseToTheOriginal) {
  const SafeTensors ref = SafeTensors::open_file(st_fixture("llama") / "reference.safetensors");
  std::map<std::string, double> errors;
  for (const auto& [name, bound] : {std::pair<std::string, double>{"llama-q8_0", 0.04}, {"llama-q4_0", 0.4}}) {
    std::unique_ptr<Model> m = load_model(gguf_fixture(name));
    EXPECT_EQ(m->info().quant_group_size, 32);
    EXPECT_EQ(m->info().quant_bits, name == "llama-q8_0" ? 8 : 4);
    const std::vector<int32_t> ids = ints(ref.get("tokens_1"));
    Array want = ref.get("logits_1");
    const int64_t vocab = want.dim(1);
    SequenceCache cache = m->make_cache({});
    Array ours = m->forward(tokens_of(ids), cache, true);
    double worst = 0;
    for (int64_t t = 0; t < want.dim(0); ++t)
      worst = std::max(worst, relative_row_error(ours.data<float>() + t * vocab, want.data<float>() + t * vocab, vocab));
    EXPECT_LT(worst, bound) << name;
    RecordProperty(name + "_worst_rel_error", std::to_string(worst));
    errors[name] = worst;
  }
  EXPECT_LT(errors["llama-q8_0"], errors["llama-q4_0"]);
}

TEST(GgufModel, NamesUnsupportedArchitecturesAndTypes) {
  testing::TempDir dir;
  // A copy of the llama fixture with its architecture renamed in place (same length).
  std::string bytes = testing::read_file(gguf_fixture("llama"));
  const std::string key = "general.architecture";
  size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  at += key.size() + 4 + 8;  // the value type, the string's length
  ASSERT_EQ(bytes.substr(at, 5), "llama");
  std::string other = bytes;
  other.replace(at, 5, "bloom");
  testing::write_file(dir / "bloom.gguf", other);
  const std::string e = error_of<Unsupported>([&] { load_model(dir / "bloom.gguf"); });
  EXPECT_NE(e.find("general.architecture \"bloom\" is not supported (supported: llama, qwen2, qwen3, gemma3, cohere2)"),
            std::string::npos)
      << e;

  // token_embd.weight relabelled IQ4_NL (its 64-element rows are whole IQ4_NL blocks, and the
  // smaller size still lies within its bytes): the reader accepts it, the loader names it.
  const GgufFile g = GgufFile::open(gguf_fixture("llama"));
  const GgufTensorInfo* embd = g.tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgufType::BF16);
  // Found by its name in the tensor table: the name, n_dims, ne[0], ne[1], then the type.
  const std::string name = "token_embd.weight";
  size_t ti = bytes.find(name, bytes.find("tokenizer.ggml.eos_token_id"));
  ASSERT_NE(ti, std::string::npos);
  const size_t type_at = ti + name.size() + 4 + 2 * 8;
  uint32_t type = 0;
  std::memcpy(&type, bytes.data() + type_at, 4);
  ASSERT_EQ(type, 30u);
  type = 20;
  std::string q = bytes;
  std::memcpy(q.data() + type_at, &type, 4);
  testing::write_file(dir / "iq4.gguf", q);
  const std::string eq = error_of<Unsupported>([&] { load_model(dir / "iq4.gguf"); });
  EXPECT_NE(eq.find("tensor token_embd.weight is IQ4_NL, which Osprey does not read (GGUF tensors of type F32, F16, "
                    "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K load"),
            std::string::npos)
      << eq;
}

TEST(GgufModel, Q8_0Q4_0AndQ4_1WeightsDequantizeExactlyAsTheFormatDefinesThem) {
  // Blocks of 32 values, two rows of 64 columns each, with values from ggml's block
  // definitions: Q8_0 {f16 d; int8 q[32]}: w = d q; Q4_0 {f16 d; u8 qs[16]}: w[j] =
  // d ((qs[j] & 15) - 8), w[j + 16] = d ((qs[j] >> 4) - 8); Q4_1 {f16 d, m; u8 qs[16]}: w = d q + m.
  const int64_t rows = 2, cols = 64, blocks = rows * cols / 32;
  std::string q8, q40, q41;
  std::vector<float> w8, w40(rows * cols), w41(rows * cols);
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u, state >> 8; };
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t d = f32_to_f16(0.01f + float(next() % 1000) * 1e-4f), m = f32_to_f16(-0.5f + float(next() % 100) * 0.01f);
    q8.append(reinterpret_cast<const char*>(&d), 2);
    for (int i = 0; i < 32; ++i) {
      const int8_t q = int8_t(int(next() % 256) - 128);
      q8.push_back(char(q));
      w8.push_back(f16_to_f32(d) * float(q));
    }
    q40.append(reinterpret_cast<const char*>(&d), 2);
    q41.append(reinterpret_cast<const char*>(&d), 2);
    q41.append(reinterpret_cast<const char*>(&m), 2);
    std::string qs;
    for (int j = 0; j < 16; ++j) qs.push_back(char(next() % 256));
    q40 += qs;
    q41 += qs;
    for (int j = 0; j < 16; ++j) {
      const int lo = uint8_t(qs[j]) & 15, hi = uint8_t(qs[j]) >> 4;
      w40[b * 32 + j] = f16_to_f32(d) * float(lo - 8);
      w40[b * 32 + j + 16] = f16_to_f32(d) * float(hi - 8);
      w41[b * 32 + j] = f16_to_f32(d) * float(lo) + f16_to_f32(m);
      w41[b * 32 + j + 16] = f16_to_f32(d) * float(hi) + f16_to_f32(m);
    }
  }
  testing::GgufBytes f;
  f.header(3, 4, 7).kv_str("general.architecture", "llama").kv_u32("llama.embedding_length", 64);
  f.kv_u32("llama.feed_forward_length", 64).kv_u32("llama.block_count", 1).kv_u32("llama.attention.head_count", 2);
  f.kv_u32("llama.attention.head_count_kv", 2).kv_u32("llama.context_length", 64);
  std::string embd(4 * 64 * 4, '\0');
  f.tensor("token_embd.weight", {64, 4}, 0, 0);
  f.tensor("blk.0.attn_q.weight", {64, 2}, 8, 1024);
  f.tensor("blk.0.attn_k.weight", {64, 2}, 2, 1024 + 160);
  f.tensor("blk.0.attn_v.weight", {64, 2}, 3, 1024 + 160 + 96);
  f.align(32);
  f.b += embd + q8 + std::string(160 - q8.size(), '\0') + q40 + std::string(96 - q40.size(), '\0') + q41;
  ASSERT_EQ(q8.size(), 136u);
  ASSERT_EQ(q41.size(), 80u);
  testing::TempDir dir;
  testing::write_file(dir / "q.gguf", f.b);
  const GgufFile g = GgufFile::open(dir / "q.gguf");
  const GgufCheckpoint ck = read_gguf_checkpoint(g);
  EXPECT_EQ(ck.config.json()["quantization"]["bits"], 4);  // two of the three are 4-bit
  EXPECT_EQ(ck.config.json()["quantization"]["model.layers.0.self_attn.q_proj"]["bits"], 8);
  auto check = [&](const std::string& module, int bits, const std::vector<float>& want) {
    QuantizedMatrix qm;
    qm.packed = ck.tensors.get(module + ".weight");
    qm.scales = ck.tensors.get(module + ".scales");
    qm.biases = ck.tensors.get(module + ".biases");
    qm.bits = bits;
    qm.group_size = 32;
    const Array w = ops::dequantize(qm, DType::f32);
    ASSERT_EQ(w.shape(), (Shape{rows, cols}));
    for (int64_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(w.data<float>()[i], want[size_t(i)]) << module << " element " << i;
  };
  check("model.layers.0.self_attn.q_proj", 8, w8);
  check("model.layers.0.self_attn.k_proj", 4, w40);
  check("model.layers.0.self_attn.v_proj", 4, w41);
}

TEST(GgufModel, RefusesABlockCountPastTheTensorCount) {
  // A hostile block count would size the layer list: it is checked against the tensors first.
  std::string bytes = testing::read_file(gguf_fixture("qwen2"));
  const std::string key = "qwen2.block_count";
  size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  at += key.size() + 4;
  const uint32_t huge = 2000000000u;
  std::memcpy(bytes.data() + at, &huge, 4);
  testing::TempDir dir;
  testing::write_file(dir / "m.gguf", bytes);
  const std::string e = error_of<InvalidInput>([&] { load_model(dir / "m.gguf"); });
  EXPECT_NE(e.find("qwen2.block_count is 2000000000, but the file holds"), std::string::npos) << e;
}

}  // namespace osprey
