#pragma once
// MLX affine quantization (docs/design.md, "Quantized weights"): the matrix type that quantized linear layers and
// embeddings are stored in, and the ops that take it. A weight is w = scale * q + bias per
// group of `group_size` consecutive input elements of a row.
//
// Packing: the codes of one row form a little-endian bit stream: code i occupies bits
// [i * bits, (i + 1) * bits) of the row's uint32 words (word j holds stream bits
// [32 j, 32 j + 32), low bits first). For bits 2, 4 and 8 that is 32 / bits codes per word,
// low bits first; for 3 and 6 a code may straddle two words. packed_in * 32 == bits * in.
#include <cstdint>
#include <optional>
#include <string>

#include "core/array.h"

namespace osprey {

struct QuantizedMatrix {
  Array packed;  // [out, in * bits / 32] u32
  Array scales;  // [out, in / group_size] f16 | bf16
  Array biases;  // [out, in / group_size], the dtype of scales
  // CPU only: the same matrix repacked for the 4- and 8-bit tile kernels (ops::repack_for_cpu),
  // or undefined. packed, scales and biases stay the reference (embeddings, other kernels)
  // unless ops::keep_tiles_only dropped them.
  Array cpu_tiles;  // [bytes] u8
  // With cpu_tiles: 0 when they hold every group's bias, or z > 0 when every bias is -z times
  // its scale (symmetric sources: GGUF's Q4_0, Q8_0 and Q6_K) and the tiles hold scales alone.
  int cpu_tiles_zero = 0;
  int bits = 0;
  int group_size = 0;
  // Tiles only (ops::keep_tiles_only): packed, scales and biases undefined, and the shape and
  // the scales' dtype kept here; linear reads the tiles, and embedding and dequantize refuse it.
  int64_t tiles_out = 0, tiles_in = 0;
  DType tiles_scale_dtype = DType::f16;

  bool tiles_only() const { return !packed.defined() && cpu_tiles.defined(); }
  bool defined() const { return packed.defined() || cpu_tiles.defined(); }
  int64_t out_features() const { return tiles_only() ? tiles_out : packed.dim(0); }
  int64_t in_features() const { return tiles_only() ? tiles_in : packed.dim(1) * 32 / bits; }
  Device device() const { return tiles_only() ? cpu_tiles.device() : packed.device(); }
  size_t nbytes() const {
    return tiles_only() ? cpu_tiles.nbytes() : packed.nbytes() + scales.nbytes() + biases.nbytes();
  }
};

// FP8 e4m3 weights kept as loaded (CUDA; the CPU dequantizes FP8 checkpoints at load):
// w[o, i] = e4m3(codes[o, i]) * scales[o, i / (in / n_groups)]. A checkpoint's per-tensor,
// per-row and 128x128-block scales all take this form (formats/hub_quant.h's load_fp8): one
// group per row for the first two, groups of gcd(in, 128) inputs (each row repeating its
// block's scale) for blocks.
struct Fp8Matrix {
  Array codes;   // [out, in] u8 (float8_e4m3fn bytes)
  Array scales;  // [out, n_groups] f32, n_groups divides in
  // The checkpoint declares FP8 activations: prompts and batches may run on the FP8 tensor
  // cores with x quantized per token (W8A8). false (weights-only FP8): x stays 16-bit.
  bool fp8_activations = true;

  bool defined() const { return codes.defined(); }
  int64_t out_features() const { return codes.dim(0); }
  int64_t in_features() const { return codes.dim(1); }
  Device device() const { return codes.device(); }
  size_t nbytes() const { return codes.nbytes() + scales.nbytes(); }
};

// A linear layer's weight: dense [out, in] (f32 | f16 | bf16), MLX-quantized or FP8. `in_perm`, when
// defined (i32 [in], on the weight's device): the weight's input j is the layer's input
// in_perm[j], and linear() gathers x by it first (GPTQ's desc_act, formats/hub_quant.h).
struct LinearWeight {
  Array dense;
  QuantizedMatrix quant;
  Fp8Matrix fp8;
  Array in_perm;

  bool quantized() const { return quant.defined(); }
  bool defined() const { return dense.defined() || quant.defined() || fp8.defined(); }
  int64_t out_features() const {
    return quantized() ? quant.out_features() : fp8.defined() ? fp8.out_features() : dense.dim(0);
  }
  int64_t in_features() const {
    return quantized() ? quant.in_features() : fp8.defined() ? fp8.in_features() : dense.dim(1);
  }
  size_t nbytes() const { return quantized() ? quant.nbytes() : fp8.defined() ? fp8.nbytes() : dense.nbytes(); }
};

// Bits supported by the quantizer, the loader and the kernels.
inline bool supported_quant_bits(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 6 || bits == 8; }
inline bool supported_group_size(int g) { return g == 32 || g == 64 || g == 128; }

namespace ops {

// x [n, in] f32, w quantized [out, in], bias [out] f32 or undefined -> [n, out] f32.
// Accumulates in f32 over the dequantized weights (scale * q + bias computed in f32).
Array linear(const Array& x, const QuantizedMatrix& w, const Array& bias = {});
// x [n, in] f32, w FP8 [out, in] on a CUDA device, bias [out] f32 or undefined -> [n, out] f32
// (backend/cuda/fp8_linear.h). Unsupported on the CPU, which dequantizes FP8 at load.
Array linear(const Array& x, const Fp8Matrix& w, const Array& bias = {});
// Whether FP8 layers with one scale per row (per-tensor and per-channel checkpoints) run on
// `device`'s FP8 tensor cores for 2 rows of x and more (W8A8: a CUDA device of compute
// capability 8.9 or later, OSPREY_CUDA_FP8_MMA on). False on the CPU.
bool fp8_tensor_cores(Device device);
// The device policy for FP8 checkpoints (docs/design.md, "FP8"): whether weights with
// `n_groups` scale groups per row stay FP8 on `device` (false: the loader dequantizes them). The
// CPU dequantizes always; elsewhere `want` decides (LoadOptions::keep_fp8), else
// OSPREY_CUDA_FP8_WEIGHTS, else they stay where they run on the FP8 tensor cores (one group per
// row) and are dequantized otherwise (block scales run faster dequantized; older GPUs).
bool keep_fp8_weights(Device device, std::optional<bool> want, int64_t n_groups);
// For the load log: how kept FP8 weights run on `device` (activations_declared: the checkpoint
// declares FP8 activations), and what dequantized ones cost.
std::string fp8_kept_note(Device device, int64_t n_groups, bool activations_declared);
std::string fp8_dequantized_note(Device device);
// Dispatches to the dense, the quantized or the FP8 linear.
Array linear(const Array& x, const LinearWeight& w, const Array& bias = {});

// table quantized [vocab, d], ids [n] i32 -> [n, d] f32 (dequantized rows, times `scale`).
Array embedding(const QuantizedMatrix& table, const Array& ids, float scale = 1.0f);
// Dispatches to the dense or the quantized embedding.
Array embedding(const LinearWeight& table, const Array& ids, float scale = 1.0f);

// The whole matrix dequantized to `dtype` (f32 | f16 | bf16), on w's device.
Array dequantize(const QuantizedMatrix& w, DType dtype = DType::f32);

// Fills w.cpu_tiles (and cpu_tiles_zero) when w lives on the CPU, has 4 bits (8 bits: the
// level has VNNI) and the CPU's level has integer kernels for it (backend/cpu/quant_int8.h);
// leaves w unchanged otherwise. Called once per
// weight at load; the copy is written by the pool's threads that will read it in decode.
void repack_for_cpu(QuantizedMatrix& w);
// When w has CPU tiles that the level's linear reads for every n (backend/cpu/quant_linear.cpp),
// drops packed, scales and biases, keeping w's shape (QuantizedMatrix::tiles_only): the tiles
// stop costing the weights' size again. For weights that only linear() reads (not an
// embedding table). Where the dropped arrays lay in a mapped checkpoint file, their resident
// pages go too (core/mapped_file.h). Returns whether w is tiles-only.
bool keep_tiles_only(QuantizedMatrix& w);
// Releases the resident pages of w's packed words, scales and biases where they lie in a
// mapped checkpoint file (their repacked tiles being what linear reads; an embedding lookup
// reads its rows back from the file): resident memory only, w is unchanged.
void release_mapped_source(const QuantizedMatrix& w);
// The same for a dense array: releases its resident pages where it is a contiguous view of a
// mapped file in host memory; does nothing for an array on a device or of the heap.
void release_mapped_source(const Array& a);

}  // namespace ops
}  // namespace osprey
