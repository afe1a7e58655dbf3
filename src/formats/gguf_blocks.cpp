#include "formats/gguf_blocks.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "core/half.h"

namespace osprey {
namespace {

// NOTE: each value's float operations are written out one by one in ggml's order; the file is
// compiled without FMA (the base -march), so no product and sum are fused into one rounding.
float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_0, Q4_1, Q5_0, Q5_1: value i of a 32-value block is the low nibble of qs[i] for i < 16,
// the high nibble of qs[i - 16] after; Q5's fifth bit i is bit i of qh.
void block32(GgufType t, const uint8_t* b, float* y) {
  const bool has_min = t == GgufType::Q4_1 || t == GgufType::Q5_1;
  const bool five = t == GgufType::Q5_0 || t == GgufType::Q5_1;
  const float d = half_at(b);
  const float m = has_min ? half_at(b + 2) : 0.0f;
  uint32_t qh = 0;
  if (five) std::memcpy(&qh, b + (has_min ? 4 : 2), 4);
  const uint8_t* qs = b + (has_min ? 4 : 2) + (five ? 4 : 0);
  for (int i = 0; i < 32; ++i) {
    int q = i < 16 ? (qs[i] & 0x0F) : (qs[i - 16] >> 4);
    if (five) q |= int((qh >> i) & 1u) << 4;
    if (has_min) {
      y[i] = d * float(q) + m;
    } else {
      y[i] = d * float(q - (five ? 16 : 8));
    }
  }
}

// Q4_K and Q5_K: 8 sub-blocks of 32; sub-block j's values are the low (j even) or high (j odd)
// nibbles of qs[32 * (j / 2) .. + 32], and for Q5_K bit j of qh[l] is the fifth bit of value l.
void block_q45k(bool five, const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 16 + (five ? 32 : 0);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    gguf_k_scale_min(scales, j, sc, m);
    const float dl = d * float(sc), ml = dmin * float(m);
    const uint8_t* q = qs + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) {
      int v = (j % 2 == 0) ? (q[l] & 0x0F) : (q[l] >> 4);
      if (five) v |= int((qh[l] >> j) & 1u) << 4;
      const float p = dl * float(v);
      y[32 * j + l] = p - ml;
    }
  }
}

// Q6_K: two halves of 128; in half h, value 32 * k + l (k = 0..3, l = 0..31) has its low four
// bits in ql[64 h + l + 32 (k % 2)] (low nibble for k < 2, high after) and its top two in
// bits 2k of qh[32 h + l]; the scale of value i is sc[i / 16].
void block_q6k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = ql[64 * h + l + 32 * (k % 2)];
        const int low = k < 2 ? (lo & 0x0F) : (lo >> 4);
        const int high = (qh[32 * h + l] >> (2 * k)) & 3;
        const int i = 128 * h + 32 * k + l;
        const float dl = d * float(sc[i / 16]);
        y[i] = dl * float((low | (high << 4)) - 32);
      }
    }
  }
}

}  // namespace

bool gguf_dequantizes(GgufType type) {
  switch (type) {
    case GgufType::Q8_0: case GgufType::Q4_0: case GgufType::Q4_1: case GgufType::Q5_0: case GgufType::Q5_1:
    case GgufType::Q4_K: case GgufType::Q5_K: case GgufType::Q6_K:
      return true;
    default:
      return false;
  }
}

void gguf_k_scale_min(const uint8_t* s, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = uint8_t((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    m = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

void gguf_dequantize(GgufType type, const uint8_t* blocks, int64_t n, float* out) {
  if (!gguf_dequantizes(type))
    throw Unsupported("gguf_dequantize: tensor type " + gguf_type_name(uint32_t(type)) + " is not decoded");
  const GgufBlock blk = *gguf_block(uint32_t(type));
  for (int64_t k = 0; k < n / blk.elements; ++k) {
    const uint8_t* b = blocks + k * blk.bytes;
    float* y = out + k * blk.elements;
    switch (type) {
      case GgufType::Q8_0: {
        const float d = half_at(b);
        for (int i = 0; i < 32; ++i) y[i] = float(int8_t(b[2 + i])) * d;
        break;
      }
      case GgufType::Q4_K: block_q45k(false, b, y); break;
      case GgufType::Q5_K: block_q45k(true, b, y); break;
      case GgufType::Q6_K: block_q6k(b, y); break;
      default: block32(type, b, y); break;
    }
  }
}

}  // namespace osprey
