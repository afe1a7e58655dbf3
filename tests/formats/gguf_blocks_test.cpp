// ggml's block-quantized types: Osprey's decoding against llama.cpp's own (gguf-py's numpy
// gguf.quants.dequantize, run by tools/make_gguf_block_fixtures.py on random blocks whose
// f16 fields span every exponent), bit for bit; and what the GGUF loader holds for each type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/ops.h"
#include "backend/quant.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/gguf.h"
#include "formats/gguf_blocks.h"
#include "formats/gguf_model.h"
#include "formats/quant_method.h"
#include "model/model.h"
#include "support/gguf_bytes.h"
#include "support/test_util.h"

namespace osprey {
namespace {

struct Fixture {
  std::string blocks;        // 4 rows of blocks
  std::vector<float> want;   // [4, n] gguf-py's values
  int64_t n = 0;             // values per row
};

Fixture fixture(const std::string& type) {
  const auto dir = testing::source_dir() / "tests/fixtures/gguf/blocks";
  Fixture f;
  f.blocks = testing::read_file(dir / (type + ".blocks"));
  const std::string v = testing::read_file(dir / (type + ".f32"));
  f.want.resize(v.size() / 4);
  std::memcpy(f.want.data(), v.data(), v.size());
  f.n = int64_t(f.want.size()) / 4;
  return f;
}

const std::vector<std::pair<std::string, GgufType>> kTypes = {
    {"Q8_0", GgufType::Q8_0}, {"Q4_0", GgufType::Q4_0}, {"Q4_1", GgufType::Q4_1}, {"Q5_0", GgufType::Q5_0},
    {"Q5_1", GgufType::Q5_1}, {"Q4_K", GgufType::Q4_K}, {"Q5_K", GgufType::Q5_K}, {"Q6_K", GgufType::Q6_K},
};

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// Blocks of `type` for [rows, cols] with every f16 field set to a modest value (so that the
// scale products stay finite in f16), the codes taken from the fixture's random bytes.
std::string modest_blocks(const Fixture& f, GgufType type, int64_t rows, int64_t cols) {
  const GgufBlock blk = *gguf_block(uint32_t(type));
  const int64_t n_blocks = rows * cols / blk.elements;
  std::string out;
  uint32_t state = 7;
  for (int64_t b = 0; b < n_blocks; ++b) {
    std::string one = f.blocks.substr(size_t(b % (int64_t(f.blocks.size()) / blk.bytes)) * size_t(blk.bytes),
                                      size_t(blk.bytes));
    std::vector<size_t> halves = {0};
    if (type == GgufType::Q4_1 || type == GgufType::Q5_1 || type == GgufType::Q4_K || type == GgufType::Q5_K)
      halves.push_back(2);
    if (type == GgufType::Q6_K) halves = {208};
    for (size_t at : halves) {
      state = state * 1664525u + 1013904223u;
      const float v = (0.0005f + float(state >> 20) * 1e-6f) * ((state & 1) && at == 2 ? -1.0f : 1.0f);
      const uint16_t h = f32_to_f16(v);
      std::memcpy(one.data() + at, &h, 2);
    }
    out += one;
  }
  return out;
}

}  // namespace

TEST(GgufBlocks, EveryTypeDecodesBitForBitAsLlamaCppsGgufPy) {
  for (const auto& [name, type] : kTypes) {
    const Fixture f = fixture(name);
    ASSERT_EQ(f.blocks.size() % 4, 0u) << name;
    const GgufBlock blk = *gguf_block(uint32_t(type));
    ASSERT_EQ(int64_t(f.blocks.size() / 4), f.n / blk.elements * blk.bytes) << name;
    std::vector<float> got(f.want.size());
    gguf_dequantize(type, reinterpret_cast<const uint8_t*>(f.blocks.data()), int64_t(got.size()), got.data());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(bits_of(got[i]), bits_of(f.want[i])) << name << " value " << i << ": " << got[i] << " vs " << f.want[i];
  }
}

TEST(GgufBlocks, RefusesTheTypesItDoesNotDecodeByName) {
  EXPECT_FALSE(gguf_dequantizes(GgufType::Q2_K));
  std::vector<float> out(256);
  std::vector<uint8_t> in(1024);
  try {
    gguf_dequantize(GgufType::Q3_K, in.data(), 256, out.data());
    FAIL() << "Q3_K decoded";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("Q3_K"), std::string::npos) << e.what();
  }
}

// Each type loaded as a linear weight of a one-layer llama file: Q5_0 and Q5_1 repacked to
// 8-bit affine groups dequantize exactly to ggml's values; Q4_K and Q5_K (f16 group scales
// d * sc and biases -dmin * m) within the f16 rounding of the scale products; Q6_K as 8-bit
// codes in groups of 16 (scale f16(d * sc), bias -32 times it) within that rounding too.
TEST(GgufBlocks, TheLoaderHoldsEachTypeAsDocumented) {
  const int64_t cols = 256, rows = 4;
  struct Case {
    std::string name;
    GgufType type;
    std::string module;
  };
  const std::vector<Case> cases = {
      {"Q5_0", GgufType::Q5_0, "model.layers.0.self_attn.q_proj"},
      {"Q5_1", GgufType::Q5_1, "model.layers.0.self_attn.k_proj"},
      {"Q4_K", GgufType::Q4_K, "model.layers.0.self_attn.v_proj"},
      {"Q5_K", GgufType::Q5_K, "model.layers.0.self_attn.o_proj"},
      {"Q6_K", GgufType::Q6_K, "model.layers.0.mlp.down_proj"},
  };
  const std::vector<std::string> gguf_names = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                                               "blk.0.attn_output.weight", "blk.0.ffn_down.weight"};
  testing::GgufBytes f;
  f.header(3, 1 + cases.size(), 7).kv_str("general.architecture", "llama").kv_u32("llama.embedding_length", 256);
  f.kv_u32("llama.feed_forward_length", 256).kv_u32("llama.block_count", 1).kv_u32("llama.attention.head_count", 2);
  f.kv_u32("llama.attention.head_count_kv", 2).kv_u32("llama.context_length", 64);
  std::string data(size_t(4 * cols * 4), '\0');  // token_embd f32 [4, 256], zeros
  f.tensor("token_embd.weight", {uint64_t(cols), 4}, 0, 0);
  std::vector<std::string> blocks;
  for (size_t i = 0; i < cases.size(); ++i) {
    blocks.push_back(modest_blocks(fixture(cases[i].name), cases[i].type, rows, cols));
    while (data.size() % 32) data.push_back('\0');
    f.tensor(gguf_names[i], {uint64_t(cols), uint64_t(rows)}, uint32_t(cases[i].type), data.size());
    data += blocks.back();
  }
  f.align(32);
  f.b += data;
  testing::TempDir dir;
  testing::write_file(dir / "k.gguf", f.b);
  const GgufFile g = GgufFile::open(dir / "k.gguf");
  const GgufCheckpoint ck = read_gguf_checkpoint(g);
  // Each repacked matrix's three arrays lie in a store of their own, which goes with the last
  // of them (a CPU weight kept as tiles alone frees its store while the embedding keeps its).
  for (size_t c = 0; c < cases.size(); ++c) {
    const Array w = ck.tensors.get(cases[c].module + ".weight");
    EXPECT_EQ(ck.tensors.get(cases[c].module + ".scales").buffer(), w.buffer()) << cases[c].name;
    EXPECT_EQ(ck.tensors.get(cases[c].module + ".biases").buffer(), w.buffer()) << cases[c].name;
    for (size_t d = 0; d < c; ++d)
      EXPECT_NE(ck.tensors.get(cases[d].module + ".weight").buffer(), w.buffer()) << cases[c].name << ", " << cases[d].name;
  }
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    std::vector<float> want(size_t(rows * cols));
    gguf_dequantize(k.type, reinterpret_cast<const uint8_t*>(blocks[c].data()), rows * cols, want.data());
    QuantizedMatrix qm;
    qm.packed = ck.tensors.get(k.module + ".weight");
    qm.scales = ck.tensors.get(k.module + ".scales");
    qm.biases = ck.tensors.get(k.module + ".biases");
    qm.bits = int(qm.packed.dim(1) * 32 / cols);
    qm.group_size = int(cols / qm.scales.dim(1));
    EXPECT_EQ(qm.bits, k.type == GgufType::Q4_K ? 4 : 8) << k.name;
    EXPECT_EQ(qm.group_size, k.type == GgufType::Q6_K ? 16 : 32) << k.name;
    const Array w = ops::dequantize(qm, DType::f32);
    ASSERT_EQ(w.shape(), (Shape{rows, cols})) << k.name;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float got = w.data<float>()[i], ref = want[size_t(i)];
      if (k.type == GgufType::Q5_0 || k.type == GgufType::Q5_1) {
        ASSERT_EQ(bits_of(got), bits_of(ref)) << k.name << " element " << i;
      } else if (k.type == GgufType::Q6_K) {
        // w = s' (q - 32) with s' = f16(d * sc): |error| <= 32 |d sc| 2^-11 (and a subnormal
        // s' at most 2^-25 off, times 32), while a wrong code is off by at least |d sc|.
        const uint8_t* blk = reinterpret_cast<const uint8_t*>(blocks[c].data()) + size_t(i / 256) * 210;
        uint16_t dh;
        std::memcpy(&dh, blk + 208, 2);
        const float dsc = f16_to_f32(dh) * float(int8_t(blk[192 + int(i % 256) / 16]));
        const float bound = 32.0f * std::fabs(dsc) * std::ldexp(1.0f, -11) * 1.001f + std::ldexp(1.0f, -20);
        ASSERT_LE(std::fabs(got - ref), bound) << k.name << " element " << i;
      } else {
        // One f16 rounding of d * sc and of dmin * m: |error| <= (31 |d sc| + |dmin m|) 2^-11,
        // while a wrong code is off by at least |d sc|.
        const size_t bytes = k.type == GgufType::Q4_K ? 144 : 176;
        const uint8_t* blk = reinterpret_cast<const uint8_t*>(blocks[c].data()) + size_t(i / 256) * bytes;
        uint16_t dh, mh;
        std::memcpy(&dh, blk, 2);
        std::memcpy(&mh, blk + 2, 2);
        uint8_t sc, mn;
        gguf_k_scale_min(blk + 4, int(i % 256) / 32, sc, mn);
        const float bound = (31.0f * std::fabs(f16_to_f32(dh) * float(sc)) + std::fabs(f16_to_f32(mh) * float(mn))) *
                            std::ldexp(1.0f, -11) * 1.001f;
        ASSERT_LE(std::fabs(got - ref), bound) << k.name << " element " << i;
      }
    }
  }
  EXPECT_EQ(ck.config.json()["quantization"]["bits"], 8);  // Q5_0, Q5_1, Q5_K
  EXPECT_EQ(ck.config.json()["quantization"]["group_size"], 32);
  EXPECT_EQ(ck.config.json()["quantization"]["model.layers.0.mlp.down_proj"]["group_size"], 16);  // Q6_K
  EXPECT_EQ(ck.config.json()["quantization"]["model.layers.0.self_attn.v_proj"]["bits"], 4);
  // Each repacked module is loaded by its block type's method (formats/quant_gguf.h).
  const QuantConfig q = parse_quant_config(ck.config);
  for (const Case& k : cases)
    EXPECT_EQ(std::string(quant_method_for(ck.tensors, q, k.module).name()), k.name) << k.module;
}

}  // namespace osprey

namespace osprey {
namespace {

// A one-layer llama file (hidden 256, 2 heads, vocab 16) whose matrices are the given types
// (F32 norms); `dense` writes every matrix as F32 holding ggml's values of the same blocks.
std::string mixed_model(const std::vector<std::pair<std::string, GgufType>>& matrices, bool dense) {
  const int64_t hidden = 256, vocab = 16;
  testing::GgufBytes f;
  f.header(3, matrices.size() + 3, 7).kv_str("general.architecture", "llama");
  f.kv_u32("llama.embedding_length", uint32_t(hidden)).kv_u32("llama.feed_forward_length", uint32_t(hidden));
  f.kv_u32("llama.block_count", 1).kv_u32("llama.attention.head_count", 2).kv_u32("llama.attention.head_count_kv", 2);
  f.kv_u32("llama.context_length", 64);
  std::string data;
  auto add = [&](const std::string& name, std::vector<uint64_t> ne, uint32_t type, const std::string& bytes) {
    while (data.size() % 32) data.push_back('\0');
    f.tensor(name, ne, type, data.size());
    data += bytes;
  };
  const std::string ones = [&] {
    std::string s;
    for (int64_t i = 0; i < hidden; ++i) {
      const float one = 1.0f;
      s.append(reinterpret_cast<const char*>(&one), 4);
    }
    return s;
  }();
  for (const char* norm : {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"})
    add(norm, {uint64_t(hidden)}, 0, ones);
  for (const auto& [name, type] : matrices) {
    const int64_t rows = name == "token_embd.weight" || name == "output.weight" ? vocab : hidden;
    const std::string blocks = modest_blocks(fixture(gguf_type_name(uint32_t(type))), type, rows, hidden);
    if (!dense) {
      add(name, {uint64_t(hidden), uint64_t(rows)}, uint32_t(type), blocks);
    } else {
      std::vector<float> w(size_t(rows * hidden));
      gguf_dequantize(type, reinterpret_cast<const uint8_t*>(blocks.data()), rows * hidden, w.data());
      add(name, {uint64_t(hidden), uint64_t(rows)}, 0, std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4));
    }
  }
  f.align(32);
  f.b += data;
  return f.b;
}

}  // namespace

// The mixes of Q4_K_M / Q5_K_M files load and run: a tied Q6_K embedding (8-bit codes in
// groups of 16, also the head), or a Q4_K embedding table with a Q5_K head, beside every other type; the logits
// match the same model with every matrix stored as F32 holding ggml's values, within the f16
// rounding of the K-quants' scales and the quantized kernels' own
// arithmetic (a few 1e-3 of the logits' range here; a block read in the wrong order is off by
// the order of the logits themselves).
// A quantized matrix with a zero dimension holds no bytes, so nothing bounds its other one: it
// is refused by name (a file whose other dimension was 2^61 overflowed the repacked shape).
TEST(GgufBlocks, AnEmptyQuantizedMatrixIsRefusedByName) {
  for (const std::vector<uint64_t>& dims : {std::vector<uint64_t>{uint64_t(1) << 61, 0}, std::vector<uint64_t>{0, 4}}) {
    testing::GgufBytes f;
    f.header(3, 2, 7).kv_str("general.architecture", "llama").kv_u32("llama.embedding_length", 256);
    f.kv_u32("llama.feed_forward_length", 256).kv_u32("llama.block_count", 1).kv_u32("llama.attention.head_count", 2);
    f.kv_u32("llama.attention.head_count_kv", 2).kv_u32("llama.context_length", 64);
    f.tensor("token_embd.weight", {256, 4}, 0, 0);
    f.tensor("blk.0.attn_q.weight", dims, uint32_t(GgufType::Q4_0), 4 * 256 * 4);
    f.align(32);
    f.b += std::string(size_t(4 * 256 * 4), '\0');
    testing::TempDir dir;
    testing::write_file(dir / "e.gguf", f.b);
    try {
      const GgufFile g = GgufFile::open(dir / "e.gguf");
      (void)read_gguf_checkpoint(g);
      ADD_FAILURE() << "an empty matrix loaded";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("blk.0.attn_q.weight"), std::string::npos) << e.what();
    }
  }
}

TEST(GgufBlocks, KQuantMixesLoadAndMatchTheirDequantizedModel) {
  const std::vector<std::pair<std::string, GgufType>> layer = {
      {"blk.0.attn_q.weight", GgufType::Q4_K},  {"blk.0.attn_k.weight", GgufType::Q4_K},
      {"blk.0.attn_v.weight", GgufType::Q6_K},  {"blk.0.attn_output.weight", GgufType::Q5_0},
      {"blk.0.ffn_gate.weight", GgufType::Q5_K}, {"blk.0.ffn_up.weight", GgufType::Q4_K},
      {"blk.0.ffn_down.weight", GgufType::Q5_1}};
  auto with = [&](std::vector<std::pair<std::string, GgufType>> head) {
    head.insert(head.end(), layer.begin(), layer.end());
    return head;
  };
  const std::vector<std::vector<std::pair<std::string, GgufType>>> mixes = {
      with({{"token_embd.weight", GgufType::Q6_K}}),
      with({{"token_embd.weight", GgufType::Q4_K}, {"output.weight", GgufType::Q5_K}}),
      with({{"token_embd.weight", GgufType::Q8_0}, {"output.weight", GgufType::Q6_K}})};
  for (size_t i = 0; i < mixes.size(); ++i) {
    testing::TempDir dir;
    testing::write_file(dir / "q.gguf", mixed_model(mixes[i], false));
    testing::write_file(dir / "f.gguf", mixed_model(mixes[i], true));
    std::unique_ptr<Model> q = load_model(dir / "q.gguf");
    std::unique_ptr<Model> f = load_model(dir / "f.gguf");
    const std::vector<int32_t> ids = {1, 5, 2, 9, 15, 3};
    SequenceCache qc = q->make_cache({}), fc = f->make_cache({});
    Array ql = q->forward(testing::tokens_of(ids), qc, true);
    Array fl = f->forward(testing::tokens_of(ids), fc, true);
    ASSERT_EQ(ql.shape(), fl.shape()) << "mix " << i;
    const int64_t vocab = fl.dim(1);
    for (int64_t t = 0; t < fl.dim(0); ++t) {
      const double e = testing::relative_row_error(ql.data<float>() + t * vocab, fl.data<float>() + t * vocab, vocab);
      EXPECT_LT(e, 1e-2) << "mix " << i << " position " << t;
    }
  }
}

}  // namespace osprey
