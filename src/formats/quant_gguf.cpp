// GGUF's block types (formats/quant_gguf.h), each repacked into Osprey's affine layout
// (backend/quant.h: codes as a little-endian bit stream per row, f16 scale and bias per group,
// w = scale * q + bias in f32) with `bits` per code in groups of `group` values:
//   exact: Q8_0 (q + 128, d, -128 d), Q4_0 (q, d, -8 d), Q4_1 (q, d, m), Q5_0 (q, d, -16 d),
//          Q5_1 (q, d, m): the same f16 d and m, and every product and sum exact in f32, so each
//          weight dequantizes to ggml's value bit for bit;
//   not exact: Q4_K, Q5_K (per 32: q, f16(d * sc), f16(-(dmin * m))) and Q6_K (8-bit codes
//          per 16: q, f16(d * sc), -32 f16(d * sc)): the scale products are rounded to f16.
#include "formats/quant_gguf.h"

#include <cstring>

#include "core/half.h"
#include "formats/gguf_blocks.h"

namespace osprey {

bool GgufBlockMethod::claims(const SafeTensors&, const QuantConfig& quant, const std::string& prefix) const {
  const auto it = quant.gguf_types.find(prefix);
  return it != quant.gguf_types.end() && it->second == name_;
}

LinearWeight GgufBlockMethod::load(LinearLoader& loader, const LinearRequest& r) const {
  return load_affine(*this, loader, r);
}

namespace {

// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1: 32 values, f16 d (and m) per block.
class GgufLegacyMethod final : public GgufBlockMethod {
 public:
  GgufLegacyMethod(GgufType type, int bits, const char* name) : GgufBlockMethod(type, bits, 32, name) {}

  void affine_groups(const uint8_t* blk, uint8_t* codes, uint16_t* scale, uint16_t* bias) const override {
    uint16_t d, m = 0;
    std::memcpy(&d, blk, 2);
    if (type() == GgufType::Q8_0) {
      for (int i = 0; i < 32; ++i) codes[i] = uint8_t(int(int8_t(blk[2 + i])) + 128);
      scale[0] = d, bias[0] = f32_to_f16(-128.0f * f16_to_f32(d));
      return;
    }
    const bool has_min = type() == GgufType::Q4_1 || type() == GgufType::Q5_1;
    const bool five = type() == GgufType::Q5_0 || type() == GgufType::Q5_1;
    uint32_t qh = 0;
    if (has_min) std::memcpy(&m, blk + 2, 2);
    if (five) std::memcpy(&qh, blk + (has_min ? 4 : 2), 4);
    const uint8_t* qs = blk + (has_min ? 4 : 2) + (five ? 4 : 0);
    for (int i = 0; i < 16; ++i) codes[i] = qs[i] & 0x0F, codes[i + 16] = qs[i] >> 4;
    if (five)
      for (int i = 0; i < 32; ++i) codes[i] = uint8_t(codes[i] | (((qh >> i) & 1u) << 4));
    scale[0] = d;
    bias[0] = has_min ? m : f32_to_f16((five ? -16.0f : -8.0f) * f16_to_f32(d));
  }
};

// Q4_K and Q5_K: 256 values in 8 sub-blocks of 32 with 6-bit scales and minimums.
class GgufKMethod final : public GgufBlockMethod {
 public:
  GgufKMethod(GgufType type, int bits, const char* name) : GgufBlockMethod(type, bits, 32, name) {}

  void affine_groups(const uint8_t* blk, uint8_t* codes, uint16_t* scale, uint16_t* bias) const override {
    uint16_t d, m;
    std::memcpy(&d, blk, 2);
    const bool five = type() == GgufType::Q5_K;
    std::memcpy(&m, blk + 2, 2);
    const float df = f16_to_f32(d), dmin = f16_to_f32(m);
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + 16 + (five ? 32 : 0);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      gguf_k_scale_min(blk + 4, j, sc, mn);
      scale[j] = f32_to_f16(df * float(sc));
      bias[j] = f32_to_f16(-(dmin * float(mn)));
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = qs[32 * (j / 2) + l];
        codes[32 * j + l] = uint8_t(((j % 2 == 0) ? (q & 0x0F) : (q >> 4)) | (five ? ((qh[l] >> j) & 1) << 4 : 0));
      }
    }
  }
};

// Q6_K: 256 values, 16 int8 scales of 16 values each.
class GgufQ6KMethod final : public GgufBlockMethod {
 public:
  GgufQ6KMethod() : GgufBlockMethod(GgufType::Q6_K, 8, 16, "Q6_K") {}

  void affine_groups(const uint8_t* blk, uint8_t* codes, uint16_t* scale, uint16_t* bias) const override {
    // Two halves of 128 values; value 32 k + l of half h (k < 4, l < 32) has its low four
    // bits in ql[64 h + 32 (k % 2) + l] (the low nibble for k < 2) and its top two in bits
    // 2 k of qh[32 h + l]; sc[i / 16] scales value i, and d the block, after d at byte 208.
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    uint16_t d;
    std::memcpy(&d, blk + 208, 2);
    const float df = f16_to_f32(d);
    for (int j = 0; j < 16; ++j) {
      scale[j] = f32_to_f16(df * float(int8_t(blk[192 + j])));
      bias[j] = f32_to_f16(-32.0f * f16_to_f32(scale[j]));
    }
    for (int i = 0; i < 256; ++i) {
      const int h = i / 128, k = i % 128 / 32, l = i % 32;
      const uint8_t lo = ql[64 * h + 32 * (k % 2) + l];
      codes[i] = uint8_t((k < 2 ? lo & 0x0F : lo >> 4) | ((qh[32 * h + l] >> (2 * k)) & 3) << 4);
    }
  }
};

}  // namespace

// One object per type, each a line of the registry (formats/quant_registry.cpp). Q5_0, Q5_1
// and Q5_K take 8-bit codes (no 5-bit kernels).
const QuantMethod& gguf_q8_0_method() {
  static const GgufLegacyMethod m(GgufType::Q8_0, 8, "Q8_0");
  return m;
}
const QuantMethod& gguf_q4_0_method() {
  static const GgufLegacyMethod m(GgufType::Q4_0, 4, "Q4_0");
  return m;
}
const QuantMethod& gguf_q4_1_method() {
  static const GgufLegacyMethod m(GgufType::Q4_1, 4, "Q4_1");
  return m;
}
const QuantMethod& gguf_q5_0_method() {
  static const GgufLegacyMethod m(GgufType::Q5_0, 8, "Q5_0");
  return m;
}
const QuantMethod& gguf_q5_1_method() {
  static const GgufLegacyMethod m(GgufType::Q5_1, 8, "Q5_1");
  return m;
}
const QuantMethod& gguf_q4_k_method() {
  static const GgufKMethod m(GgufType::Q4_K, 4, "Q4_K");
  return m;
}
const QuantMethod& gguf_q5_k_method() {
  static const GgufKMethod m(GgufType::Q5_K, 8, "Q5_K");
  return m;
}
const QuantMethod& gguf_q6_k_method() {
  static const GgufQ6KMethod m;
  return m;
}

const GgufBlockMethod* gguf_block_method(GgufType type) {
  for (const QuantMethod* m : quant_methods())
    if (const auto* g = dynamic_cast<const GgufBlockMethod*>(m); g && g->type() == type) return g;
  return nullptr;
}

}  // namespace osprey
