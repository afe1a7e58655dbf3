// The one table of what the file formats know of each family (formats/family_formats.h): every
// registered family has a row, every row says how it is written to GGUF or why it is not, each
// architecture reads back as the family that writes it, and the mixtures of experts are refused
// by name in both directions.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "formats/family_formats.h"
#include "formats/gguf.h"
#include "formats/gguf_model.h"
#include "formats/gguf_writer.h"
#include "model/model.h"
#include "support/gguf_bytes.h"
#include "support/test_util.h"

namespace osprey {
namespace {

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(FamilyFormats, EveryRegisteredFamilyHasOneRowAndEveryRowAFamily) {
  const std::vector<std::string> families = registered_families();
  for (const std::string& name : families) EXPECT_NE(family_formats(name), nullptr) << name;
  for (const FamilyFormats& f : family_formats()) {
    EXPECT_TRUE(listed(families, f.model_type)) << f.model_type;
    if (f.reads_as) {
      EXPECT_TRUE(listed(families, f.reads_as)) << f.model_type << " reads as " << f.reads_as;
    }
    size_t rows = 0;
    for (const FamilyFormats& g : family_formats()) rows += std::string(g.model_type) == f.model_type;
    EXPECT_EQ(rows, 1u) << f.model_type;
  }
}

TEST(FamilyFormats, EveryRowIsWrittenToGgufOrSaysWhyNot) {
  for (const FamilyFormats& f : family_formats()) {
    const FamilyFormats* formats = family_formats(f.model_type);
    ASSERT_NE(formats, nullptr) << f.model_type;
    EXPECT_TRUE(formats->gguf_arch || formats->no_gguf_because) << f.model_type;
    if (formats->window == GgufWindow::pattern) {
      EXPECT_GT(formats->window_pattern, 0) << f.model_type;
    }
    if (formats->gguf_pre) {
      EXPECT_NE(gguf_pre_tokenizer(formats->gguf_pre), nullptr) << f.model_type;
    }
  }
}

TEST(FamilyFormats, EachArchitectureReadsBackAsTheFamilyThatWritesIt) {
  for (const FamilyFormats& f : family_formats()) {
    if (!f.gguf_arch) continue;
    // A family that slides every layer is told apart by the window its file states.
    const FamilyFormats* back = family_formats_of_gguf_arch(f.gguf_arch, f.window == GgufWindow::every_layer);
    EXPECT_EQ(back, &f) << f.model_type << " written as " << f.gguf_arch;
  }
  EXPECT_EQ(std::string(family_formats_of_gguf_arch("llama", false)->model_type), "llama");
  EXPECT_EQ(std::string(family_formats_of_gguf_arch("llama", true)->model_type), "mistral");
  EXPECT_EQ(family_formats_of_gguf_arch("bloom", false), nullptr);
  EXPECT_EQ(gguf_archs_supported(), "llama, qwen2, qwen3, gemma3, cohere2");
  EXPECT_EQ(gguf_model_types_supported(), "llama, mistral, qwen2, qwen3, gemma3_text, cohere2");
}

TEST(FamilyFormats, MixturesOfExpertsAreRefusedByNameInGguf) {
  testing::TempDir dir;
  // A llama-architecture file with experts (as llama.cpp writes Mixtral): refused before its tensors.
  testing::GgufBytes g;
  g.header(3, 1, 3).kv_str("general.architecture", "llama").kv_u32("llama.block_count", 1).kv_u32("llama.expert_count", 8);
  g.tensor("token_embd.weight", {8, 4}, 0, 0).align(32);
  g.b += std::string(8 * 4 * 4, '\0');
  testing::write_file(dir / "moe.gguf", g.b);
  const std::string e = testing::error_of<Unsupported>([&] { read_gguf_checkpoint(GgufFile::open(dir / "moe.gguf")); });
  EXPECT_NE(e.find("llama.expert_count is 8: GGUF files of a mixture of experts are not read"), std::string::npos)
      << e;
  // Nor written: the error says why, and which families are.
  for (const char* model_type : {"mixtral", "qwen3_moe"}) {
    testing::write_file(dir / "config.json", std::string("{\"model_type\": \"") + model_type + "\"}");
    try {
      convert_to_gguf(dir.path(), dir / "out.gguf", GgufOutType::f16);
      ADD_FAILURE() << model_type << " written";
    } catch (const Unsupported& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("is not written to GGUF (a mixture of experts"), std::string::npos) << what;
      EXPECT_NE(what.find("supported: llama, mistral,"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace osprey
