// Families from GGUF files: each fixture checkpoint converted to GGUF as llama.cpp's converter
// lays it out (tools/make_gguf_fixtures.py: renamed tensors, Llama's permuted q/k rows,
// Gemma's 1 + w norms, Llama 3's rope factors as a tensor) loads through the same family code
// and matches transformers' logits on the safetensors original (reference.safetensors) as
// closely as the safetensors checkpoint does, with the same greedy tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "core/error.h"
#include "engine/generator.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "support/test_util.h"

namespace osprey {
namespace {

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

template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
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
                         ::testing::Values("llama", "qwen2", "qwen3", "gemma3", "cohere2", "mistral"));

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

  // token_embd.weight relabelled Q8_0 (its 64-element rows are whole Q8_0 blocks, and the
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
  type = 8;
  std::string q = bytes;
  std::memcpy(q.data() + type_at, &type, 4);
  testing::write_file(dir / "q8.gguf", q);
  const std::string eq = error_of<Unsupported>([&] { load_model(dir / "q8.gguf"); });
  EXPECT_NE(eq.find("tensor token_embd.weight is Q8_0, which Osprey does not read yet"), std::string::npos) << eq;
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
