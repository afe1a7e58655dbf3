// The ops of backend/quant.h: argument checks and device dispatch to the CPU
// (backend/cpu/quant_kernels.h) or CUDA (backend/cuda/quant_kernels.h) kernels.
#include "backend/quant.h"

#include "backend/cpu/kernel_table.h"
#include "backend/cpu/quant_int8.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu_level.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"
#include "backend/quant_args.h"
#include "backend/op_checks.h"
#include "core/env.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"

namespace osprey::ops {
bool fp8_tensor_cores(Device device) { return !device.is_cpu() && cuda_ops::fp8_tensor_cores(); }

bool keep_fp8_weights(Device device, std::optional<bool> want, int64_t n_groups) {
  if (device.is_cpu()) return false;
  if (!want) want = env_options().cuda_fp8_weights;
  return want ? *want : fp8_tensor_cores(device) && n_groups == 1;
}

std::string fp8_kept_note(Device device, int64_t n_groups, bool activations_declared) {
  const bool w8a8 = activations_declared || env_options().cuda_fp8_activations;
  if (!(fp8_tensor_cores(device) && n_groups == 1 && w8a8)) return "activations are not quantized";
  return std::string("2 rows and more (prompts, batches) run on the FP8 tensor cores with activations quantized to "
                     "e4m3 per token") +
         (activations_declared ? "" : " (OSPREY_CUDA_FP8_ACTIVATIONS: the checkpoint declares none; faster prompts, less accurate)") +
         ", one row with unquantized activations";
}

std::string fp8_dequantized_note(Device device) {
  return device.is_cpu() ? "" : " (OSPREY_CUDA_FP8_WEIGHTS=1 keeps them FP8, at half the memory and slower)";
}

namespace {

using detail::on_cuda;
using detail::require;

std::string describe(const QuantizedMatrix& w) {
  if (w.tiles_only())
    return "tiles only [" + std::to_string(w.tiles_out) + ", " + std::to_string(w.tiles_in) + "] (" +
           osprey::describe(w.cpu_tiles) + "), bits " + std::to_string(w.bits) + ", group size " +
           std::to_string(w.group_size);
  return "packed " + osprey::describe(w.packed) + ", scales " + osprey::describe(w.scales) + ", biases " +
         osprey::describe(w.biases) + ", bits " + std::to_string(w.bits) + ", group size " +
         std::to_string(w.group_size);
}

QuantArgs tiles_only_args(const char* op, const QuantizedMatrix& w);

// a.tiles (and tiles_zero) from w's CPU tiles, checked against a's shape, bits and group size.
void attach_tiles(const char* op, const QuantizedMatrix& w, QuantArgs& a) {
  a.tiles_zero = w.cpu_tiles_zero;
  const bool fits = a.bits == 8 ? cpu::int8_tiles8_takes(a) && w.cpu_tiles.nbytes() == size_t(cpu::q8_tiles_bytes(a))
                                 : cpu::int8_path_takes(a) && w.cpu_tiles.nbytes() == size_t(cpu::q4_tiles_bytes(a));
  require(w.device().is_cpu() && w.cpu_tiles.device().is_cpu() && w.cpu_tiles.dtype() == DType::u8 &&
              w.cpu_tiles.is_contiguous() && fits,
          op, [&] {
            return "cpu_tiles (" + osprey::describe(w.cpu_tiles) + ") are not the CPU tiles of " + describe(w) +
                   " (made by repack_for_cpu)";
          });
  a.tiles = w.cpu_tiles.raw();
}

// Checks the matrix's own consistency and returns its kernel arguments.
QuantArgs quant_args(const char* op, const QuantizedMatrix& w) {
  if (w.tiles_only()) return tiles_only_args(op, w);
  require(w.packed.defined() && w.scales.defined() && w.biases.defined(), op,
          [&] { return "quantized matrix needs packed words, scales and biases, got " + describe(w); });
  require(supported_quant_bits(w.bits), op,
          [&] { return "unsupported bits in " + describe(w) + " (supported: 2, 3, 4, 6, 8)"; });
  require(supported_quant_group(w.bits, w.group_size), op,
          [&] { return "unsupported group size in " + describe(w) + " (supported: 32, 64, 128; 16 for 8-bit codes)"; });
  require(w.packed.dtype() == DType::u32 && w.packed.ndim() == 2 && w.packed.is_contiguous(), op,
          [&] { return "packed words must be a contiguous uint32 matrix, got " + describe(w); });
  const int64_t out = w.packed.dim(0), in = w.in_features();
  require((w.packed.dim(1) * 32) % w.bits == 0 && in % w.group_size == 0, op,
          [&] { return "group size does not divide the input size in " + describe(w); });
  const Shape group_shape{out, in / w.group_size};
  require((w.scales.dtype() == DType::f16 || w.scales.dtype() == DType::bf16) && w.scales.shape() == group_shape &&
              w.scales.is_contiguous(),
          op, [&] {
            return "scales must be contiguous float16 or bfloat16 " + group_shape.str() + ", got " + describe(w);
          });
  require(w.biases.dtype() == w.scales.dtype() && w.biases.shape() == group_shape && w.biases.is_contiguous(), op,
          [&] { return "biases must match the scales " + group_shape.str() + ", got " + describe(w); });
  QuantArgs a;
  a.packed = w.packed.data<uint32_t>();
  a.scales = w.scales.raw();
  a.biases = w.biases.raw();
  a.scale_dtype = w.scales.dtype();
  a.bits = w.bits;
  a.group_size = w.group_size;
  a.out = out;
  a.in = in;
  if (w.cpu_tiles.defined()) attach_tiles(op, w, a);
  return a;
}

// A tiles-only matrix's arguments: the shape and dtype it kept, the tiles, no packed words.
QuantArgs tiles_only_args(const char* op, const QuantizedMatrix& w) {
  require(!w.scales.defined() && !w.biases.defined(), op,
          [&] { return "a tiles-only matrix has no scales or biases of its own, got " + describe(w); });
  require(supported_quant_bits(w.bits) && supported_quant_group(w.bits, w.group_size) && w.tiles_out > 0 &&
              w.tiles_in > 0 && w.tiles_in % w.group_size == 0 &&
              (w.tiles_scale_dtype == DType::f16 || w.tiles_scale_dtype == DType::bf16),
          op, [&] {
            return "a tiles-only matrix needs a valid shape, bits, group size and scale dtype, got " + describe(w);
          });
  QuantArgs a;
  a.scale_dtype = w.tiles_scale_dtype;
  a.bits = w.bits;
  a.group_size = w.group_size;
  a.out = w.tiles_out;
  a.in = w.tiles_in;
  attach_tiles(op, w, a);
  return a;
}

// The ops that read the packed words themselves refuse a tiles-only matrix by name.
void require_packed(const char* op, const QuantizedMatrix& w) {
  require(!w.tiles_only(), op, [&] {
    return "the matrix is tiles only (its packed words were dropped after the CPU repack: only linear takes it), "
           "got " + describe(w);
  });
}

// Whether the CPU level's linear reads w's tiles for every n (cpu/quant_linear.cpp's linear_q):
// 4 bits on any int8 set of the level's width, 8 bits where it has VNNI.
bool level_reads_tiles(const QuantizedMatrix& w) {
  cpu::Int8Isa isa;
  return w.cpu_tiles.defined() && cpu::int8_isa_best(cpu_level(), &isa) &&
         (w.bits == 4 || cpu::int8_isa_exact_u8(isa));
}

}  // namespace

Array linear(const Array& x, const QuantizedMatrix& w, const Array& bias) {
  const bool gpu = on_cuda("linear", {&x, &w.packed, &w.scales, &w.biases, &bias});
  const QuantArgs a = quant_args("linear", w);
  require(x.defined() && x.dtype() == DType::f32 && x.is_contiguous(), "linear",
          [&] { return "x must be contiguous float32, got " + osprey::describe(x); });
  require(x.ndim() >= 1 && x.dim(-1) == a.in, "linear", [&] {
    return "input " + osprey::describe(x) + " does not match the quantized weight's " + std::to_string(a.in) +
           " inputs (" + describe(w) + ")";
  });
  if (bias.defined())
    require(bias.dtype() == DType::f32 && bias.numel() == a.out && bias.is_contiguous(), "linear",
            [&] { return "bias must be float32 [" + std::to_string(a.out) + "], got " + osprey::describe(bias); });
  const int64_t n = x.numel() / a.in;
  Array y = Array::empty({n, a.out}, DType::f32, x.device());
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  const bool invariant = batch_invariant();
  if (gpu) {
    cuda_ops::linear_q(x.data<float>(), n, a, b, y.data<float>(), invariant);
    return y;
  }
  // Batch-invariant mode: where the level's linear reads w's tiles, every n already gives each
  // row the same bits (the tile kernel); otherwise each row goes through the n == 1 kernels
  // (the int8 matvec for 4 bits, else the fused f32 matvec), whose arithmetic differs from the
  // many-row kernels', at one pass over w per row.
  if (invariant && !level_reads_tiles(w)) {
    for (int64_t j = 0; j < n; ++j)
      cpu::kernels().linear_q(x.data<float>() + j * a.in, 1, a, b, y.data<float>() + j * a.out, cpu_pool());
    return y;
  }
  cpu::kernels().linear_q(x.data<float>(), n, a, b, y.data<float>(), cpu_pool());
  return y;
}

Array linear(const Array& x, const Fp8Matrix& w, const Array& bias) {
  const bool gpu = on_cuda("linear", {&x, &w.codes, &w.scales, &bias});
  const std::string what = "FP8 codes " + osprey::describe(w.codes) + ", scales " + osprey::describe(w.scales);
  require(w.codes.defined() && w.codes.dtype() == DType::u8 && w.codes.ndim() == 2 && w.codes.is_contiguous(), "linear",
          "FP8 codes must be a contiguous uint8 matrix, got " + what);
  const int64_t out = w.codes.dim(0), in = w.codes.dim(1);
  require(w.scales.defined() && w.scales.dtype() == DType::f32 && w.scales.ndim() == 2 && w.scales.dim(0) == out &&
              w.scales.dim(1) > 0 && in % w.scales.dim(1) == 0 && w.scales.is_contiguous(),
          "linear", "FP8 scales must be contiguous float32 [out, groups] with groups dividing the inputs, got " + what);
  require(x.defined() && x.dtype() == DType::f32 && x.is_contiguous() && x.ndim() >= 1 && x.dim(-1) == in, "linear",
          "x must be contiguous float32 [..., " + std::to_string(in) + "] for the FP8 weight, got " + osprey::describe(x));
  if (bias.defined())
    require(bias.dtype() == DType::f32 && bias.numel() == out && bias.is_contiguous(), "linear",
            "bias must be float32 [" + std::to_string(out) + "], got " + osprey::describe(bias));
  if (!gpu)
    throw Unsupported("linear: FP8 weights are kept as FP8 on CUDA only (the CPU dequantizes them at load), got " + what);
  const int64_t n = x.numel() / in;
  Array y = Array::empty({n, out}, DType::f32, x.device());
  Fp8Args a;
  a.codes = w.codes.data<uint8_t>();
  a.scales = w.scales.data<float>();
  a.out = out;
  a.in = in;
  a.n_groups = w.scales.dim(1);
  a.fp8_activations = w.fp8_activations || env_options().cuda_fp8_activations;
  cuda_ops::linear_fp8(x.data<float>(), n, a, bias.defined() ? bias.data<float>() : nullptr, y.data<float>(),
                       batch_invariant());
  return y;
}

Array gather_inputs(const Array& x, const Array& perm) {
  // A row gather (the embedding op) between two transposing copies.
  require(perm.dtype() == DType::i32 && perm.ndim() == 1 && x.defined() && x.dtype() == DType::f32 &&
              x.is_contiguous() && x.ndim() >= 1 && x.dim(-1) == perm.numel(),
          "linear", "input order " + osprey::describe(perm) + " does not fit x " + osprey::describe(x));
  const int64_t in = perm.numel(), n = x.numel() / in;
  if (n == 1) return embedding(x.reshape({in, 1}), perm).reshape(x.shape());
  const Array xt = cast(Array::strided(x.buffer(), x.byte_offset(), {in, n}, {1, in}, DType::f32), DType::f32);
  const Array g = embedding(xt, perm);  // [in, n]
  return cast(Array::strided(g.buffer(), g.byte_offset(), {n, in}, {1, n}, DType::f32), DType::f32).reshape(x.shape());
}

Array linear(const Array& x, const LinearWeight& w, const Array& bias) {
  require(w.defined(), "linear", "the weight is undefined (neither dense nor quantized)");
  return w.method().linear(x, w, bias);
}

Array embedding(const QuantizedMatrix& table, const Array& ids, float scale) {
  require_packed("embedding", table);
  const bool gpu = on_cuda("embedding", {&table.packed, &table.scales, &table.biases, &ids});
  const QuantArgs a = quant_args("embedding", table);
  require(ids.defined() && ids.dtype() == DType::i32 && ids.ndim() == 1 && ids.is_contiguous(), "embedding",
          "ids must be int32 [n], got " + osprey::describe(ids));
  Array out = Array::empty({ids.numel(), a.in}, DType::f32, ids.device());
  if (gpu) {
    // NOTE: ids on the device are not range-checked here (that would need a sync); the
    // generator checks prompt ids, and sampled ids are in range by construction.
    cuda_ops::embedding_q(a, ids.data<int32_t>(), ids.numel(), scale, out.data<float>());
    return out;
  }
  check_token_ids({ids.data<int32_t>(), size_t(ids.numel())}, a.out);
  cpu::kernels().dequantize_rows(a, ids.data<int32_t>(), ids.numel(), scale, out.data<float>());
  return out;
}

Array embedding(const LinearWeight& table, const Array& ids, float scale) {
  require(table.defined(), "embedding", "the table is undefined (neither dense nor quantized)");
  return table.method().embedding(table, ids, scale);
}

Array dequantize(const QuantizedMatrix& w, DType dtype) {
  require_packed("dequantize", w);
  const bool gpu = on_cuda("dequantize", {&w.packed, &w.scales, &w.biases});
  const QuantArgs a = quant_args("dequantize", w);
  require(is_float(dtype), "dequantize",
          std::string("the output must be float32, float16 or bfloat16, got ") + dtype_name(dtype));
  Array out = Array::empty({a.out, a.in}, dtype, w.device());
  if (gpu) {
    cuda_ops::dequantize(a, dtype, out.raw());
    return out;
  }
  cpu::kernels().dequantize(a, dtype, out.raw());
  return out;
}

void repack_for_cpu(QuantizedMatrix& w) {
  if (!w.defined() || !w.packed.device().is_cpu()) return;
  QuantizedMatrix plain = w;
  plain.cpu_tiles = Array();
  plain.cpu_tiles_zero = 0;
  QuantArgs a = quant_args("repack_for_cpu", plain);
  cpu::Int8Isa isa;
  if (a.bits == 8) {
    // 8-bit tiles only where the level's kernels have VNNI to read them.
    if (!cpu::int8_tiles8_takes(a) || !cpu::int8_isa_best(cpu_level(), &isa) || !cpu::int8_isa_exact_u8(isa)) return;
  } else if (!cpu::int8_path_takes(a) || !cpu::int8_isa_best(cpu_level(), &isa)) {
    // Only where the level's kernels read them (none at the scalar level).
    return;
  }
  // A symmetric matrix (every bias -z times its scale) keeps its scales alone: fewer bytes
  // per decoded token.
  a.tiles_zero = cpu::tiles_symmetric_zero(a);
  Array tiles = Array::empty({a.bits == 8 ? cpu::q8_tiles_bytes(a) : cpu::q4_tiles_bytes(a)}, DType::u8);
  if (a.bits == 8)
    cpu::repack_q8_tiles(a, tiles.raw(), cpu_pool());
  else
    cpu::repack_q4_tiles(a, tiles.raw(), cpu_pool());
  w.cpu_tiles = std::move(tiles);
  w.cpu_tiles_zero = a.tiles_zero;
}

namespace {
void release_pages_of(const Array& a) {
  if (a.defined() && a.device().is_cpu() && a.is_contiguous()) release_mapped_pages(a.raw(), a.nbytes());
}
}  // namespace

void release_mapped_source(const Array& a) { release_pages_of(a); }

void release_mapped_source(const QuantizedMatrix& w) {
  if (!w.cpu_tiles.defined()) return;  // without tiles, linear reads these pages
  release_pages_of(w.packed);
  release_pages_of(w.scales);
  release_pages_of(w.biases);
}

bool keep_tiles_only(QuantizedMatrix& w) {
  if (w.tiles_only()) return true;
  if (!level_reads_tiles(w)) return false;
  const QuantArgs a = quant_args("keep_tiles_only", w);
  release_mapped_source(w);
  w.tiles_out = a.out;
  w.tiles_in = a.in;
  w.tiles_scale_dtype = a.scale_dtype;
  w.packed = Array();
  w.scales = Array();
  w.biases = Array();
  return true;
}

}  // namespace osprey::ops

namespace osprey {

Array LinearKernel::embedding(const LinearWeight&, const Array&, float) const {
  throw InvalidInput(std::string("embedding: a table of quantization method ") + name() + " is not supported");
}

void LinearKernel::release_table_pages(const LinearWeight&) const {}

}  // namespace osprey
