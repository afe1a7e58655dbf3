#pragma once
// ggml's block-quantized tensor types, decoded value by value as ggml's reference
// (dequantize_row_* in ggml-quants.c, and llama.cpp's numpy gguf.quants) defines them: every
// value is computed in float32 by the same operations in the same order, so it is the same
// float bit for bit (tests/formats/gguf_blocks_test.cpp checks that against gguf-py's output).
//
//   Q8_0  34 B / 32:  d f16, q int8[32]                       w = q * d
//   Q4_0  18 B / 32:  d f16, q 4-bit[32]                      w = d * (q - 8)
//   Q4_1  20 B / 32:  d, m f16, q 4-bit[32]                   w = d * q + m
//   Q5_0  22 B / 32:  d f16, qh u32 (5th bits), q 4-bit[32]   w = d * (q - 16)
//   Q5_1  24 B / 32:  d, m f16, qh u32, q 4-bit[32]           w = d * q + m
//   Q4_K 144 B / 256: d, dmin f16, 8 x (sc, m) 6-bit, q 4-bit  w = (d * sc) * q - dmin * m   (per 32)
//   Q5_K 176 B / 256: as Q4_K, plus qh 5th bits                w = (d * sc) * q - dmin * m   (per 32)
//   Q6_K 210 B / 256: ql 4-bit, qh 2-bit, 16 x sc int8, d f16  w = (d * sc) * (q - 32)       (per 16)
#include <cstdint>

#include "formats/gguf.h"

namespace osprey {

// Whether gguf_dequantize decodes `type` (the types above).
bool gguf_dequantizes(GgufType type);

// The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes.
void gguf_k_scale_min(const uint8_t* scales, int j, uint8_t& sc, uint8_t& m);

// Decodes n values (a whole number of blocks of `type`, checked by the caller) from `blocks`
// into out[n]. Throws Unsupported for a type gguf_dequantizes() refuses.
void gguf_dequantize(GgufType type, const uint8_t* blocks, int64_t n, float* out);

}  // namespace osprey
