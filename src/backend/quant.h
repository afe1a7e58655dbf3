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
#include <variant>

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

// GPTQ's payload (formats/quant_gptq.cpp): its codes repacked into the affine layout and, for
// desc_act, `in_perm` (i32 [in], on the weight's device; undefined otherwise): the matrix's input
// j is the layer's input in_perm[j], and its linear gathers x by it first.
struct PermutedMatrix {
  QuantizedMatrix q;
  Array in_perm;
};

class LinearWeight;

// How the weights of one quantization method run (docs/design.md, "Quantized weights"): the
// kernel half of a method, which formats/quant_method.h's QuantMethod completes with detection,
// loading, slicing and stacking. One immutable object per method, shared by all of its weights
// and by every thread; a LinearWeight points to it. Each function takes a weight of this method.
class LinearKernel {
 public:
  virtual ~LinearKernel() = default;
  // The method's name, as errors and logs give it ("dense", "mlx-affine", "awq", ...).
  virtual const char* name() const = 0;
  // x [n, in] f32, bias [out] f32 or undefined -> [n, out] f32.
  // NOTE: called once per layer and step: no allocation or string work before the kernel.
  virtual Array linear(const Array& x, const LinearWeight& w, const Array& bias) const = 0;
  // table [vocab, d], ids [n] i32 -> [n, d] f32 rows times `scale`. The default refuses the
  // method by name (InvalidInput).
  virtual Array embedding(const LinearWeight& table, const Array& ids, float scale) const;
  virtual int64_t out_features(const LinearWeight& w) const = 0;
  virtual int64_t in_features(const LinearWeight& w) const = 0;
  virtual size_t nbytes(const LinearWeight& w) const = 0;
  // The float dtype of its values (dense) or of its scales (quantized): the width the model's
  // other tensors follow.
  virtual DType value_dtype(const LinearWeight& w) const = 0;
  // The address of its main storage: equal for two handles of one weight (a tied head is the
  // embedding table itself).
  virtual const void* storage(const LinearWeight& w) const = 0;
  // Gives back the resident pages of a table that lookups read a few rows a step from a mapped
  // file (core/mapped_file.h); the default does nothing.
  virtual void release_table_pages(const LinearWeight& w) const;
};

// A linear layer's weight [out, in] (an embedding table loads the same way): the handle of one
// quantization method, which is the method and its payload. The payload is one of the storage
// kinds below, the one its method reads; callers ask the handle, never the payload (the
// method's own code, and tests, read it with payload<P>()). Copies share the arrays.
class LinearWeight {
 public:
  using Payload = std::variant<std::monostate, Array, QuantizedMatrix, Fp8Matrix, PermutedMatrix>;

  LinearWeight() = default;
  template <class P>
  LinearWeight(const LinearKernel& method, P payload) : method_(&method), payload_(std::move(payload)) {}

  bool defined() const { return method_ != nullptr; }
  // The method (requires defined()).
  const LinearKernel& method() const { return *method_; }
  int64_t out_features() const { return method_->out_features(*this); }
  int64_t in_features() const { return method_->in_features(*this); }
  size_t nbytes() const { return method_->nbytes(*this); }
  DType value_dtype() const { return method_->value_dtype(*this); }
  const void* storage() const { return method_ ? method_->storage(*this) : nullptr; }
  void release_table_pages() const {
    if (method_) method_->release_table_pages(*this);
  }

  // The payload when it is a P, else nullptr.
  template <class P>
  const P* payload() const { return std::get_if<P>(&payload_); }
  template <class P>
  P* payload() { return std::get_if<P>(&payload_); }

 private:
  const LinearKernel* method_ = nullptr;
  Payload payload_;
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
// w's method's linear (LinearKernel::linear): one indirect call.
Array linear(const Array& x, const LinearWeight& w, const Array& bias = {});

// table quantized [vocab, d], ids [n] i32 -> [n, d] f32 (dequantized rows, times `scale`).
Array embedding(const QuantizedMatrix& table, const Array& ids, float scale = 1.0f);
// table's method's embedding (LinearKernel::embedding).
Array embedding(const LinearWeight& table, const Array& ids, float scale = 1.0f);
// x [..., in] with its last axis gathered by `perm` (i32 [in]): x'[r, j] = x[r, perm[j]]
// (GPTQ's desc_act order), on x's device.
Array gather_inputs(const Array& x, const Array& perm);

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
