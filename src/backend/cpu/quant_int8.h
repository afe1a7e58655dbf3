#pragma once
// The 4-bit quantized linear layer over integer activations: x is rounded once per call, per
// block of 32 values with step d = max|x| / 127, to two int8 parts h and l with
// x ~= (d / 256) (256 h + l), and the 4-bit codes meet both in integer dot products (u8 x s8).
// Internal to src/backend/cpu; linear_q (quant_kernels.h) calls it for 4-bit weights, and tests
// and benchmarks pin an instruction set through it.
//
// Per group g of a row (codes q, scale s, bias b) and block j of x:
//   sum_k w_k x_k  ~=  s * sum_j (d_j / 256) * sum_{k in j} q_k * (256 h_k + l_k)  +  b * sum_{k in g} x_k,
// the inner sums exact in int32, the bias term with the f32 sum of x itself. Each value of x is
// off by at most d_j / 512 (d_j / 256 in the rare case where l is clamped to 127), about 16 bits.
#include <cstdint>

#include "backend/cpu_level.h"
#include "backend/quant_args.h"
#include "core/thread_pool.h"

namespace osprey::cpu {

// The instruction sets of the integer kernels, chosen at run time from the CPU's features.
enum class Int8Isa {
  avx2,         // AVX2 vpmaddubsw + vpmaddwd
  avx_vnni,     // AVX-VNNI vpdpbusd on 256 bits
  avx512bw,     // AVX-512BW vpmaddubsw + vpmaddwd
  avx512_vnni,  // AVX-512 VNNI vpdpbusd
  // AVX-512 VNNI, with the tile kernels' runs of 16 and more rows of x on AMX-INT8's tile unit
  // (TDPBSUD; the same bits as avx512_vnni). Where the CPU and the OS offer it; chosen by
  // int8_isa_best only with OSPREY_CPU_AMX=1.
  amx,
};

const char* int8_isa_name(Int8Isa isa);
// Whether the running CPU (and the build's compiler) has `isa`.
bool int8_isa_supported(Int8Isa isa);
// The fastest supported one, or false when the CPU has none of them (no AVX2).
bool int8_isa_best(Int8Isa* isa);
// The fastest supported one of the vector width that `level` runs: none at scalar, AVX-VNNI or
// AVX2 at v3, any at v4 and v4-bf16 (AVX-512 VNNI where the CPU has it). False when none.
bool int8_isa_best(CpuLevel level, Int8Isa* isa);

// Whether linear_q4_int8 takes w: 4 bits, group 32, 64 or 128, f16 or bf16 scales.
bool int8_path_takes(const QuantArgs& w);

// The decode kernels' copy of w (QuantArgs::tiles), made once at load. Rows go in tiles of
// kQ4TileRows (the last one padded with zero rows); a tile is one contiguous run of
// n_groups records, and group g's record is
//   [kQ4TileRows] scales, [kQ4TileRows] biases (w's 16-bit dtype, 64 bytes; the scales alone,
//   32 bytes, in symmetric tiles: w.tiles_zero, below), then per 32 codes
//   of the group 4 chunks of [kQ4TileRows rows][4 bytes], byte e of row r in chunk c holding
//   code 4c + e of the 32 in its low nibble and code 16 + 4c + e in its high one,
// so that one 64-byte load gives 16 rows x 4 codes and one broadcast of 4 values of x feeds
// them all (the rows interleaved as GGML's repacked Q4_0 blocks do, here with MLX's scale and
// bias per group). Each thread of the tile kernel streams one contiguous run of tiles. The
// tile kernel takes every n (decode, batches and prefill), so that a weight with tiles never
// reads its packed words after load.
inline constexpr int kQ4TileRows = 16;
// Bytes of the tiles of w (int8_path_takes(w) must hold), symmetric ones where w.tiles_zero.
int64_t q4_tiles_bytes(const QuantArgs& w);
// Writes the tiles of w to dst [q4_tiles_bytes(w)], on `pool` with the split of the decode
// kernel over tiles, so that each tile's pages are first written by the thread that reads them
// (with an equally sized pool); symmetric tiles where w.tiles_zero. Throws Unsupported unless
// int8_path_takes(w), or when w.tiles_zero is set and some group's bias is not -z times its scale.
void repack_q4_tiles(const QuantArgs& w, void* dst, ThreadPool& pool);

// Symmetric tiles (QuantArgs::tiles_zero = z > 0): where every group's bias is exactly -z times
// its scale in f32 (GGUF's Q4_0: z 8; Q8_0 held as codes + 128: z 128; Q6_K: z 32), a group's
// record holds its 16 scales alone (32 bytes, not 64) and the kernels form each bias as
// scale * -z, the same f32 value: the same results from fewer bytes (4.5 bits a 4-bit weight
// of group 32 instead of 5). The z of w (0 when w is not symmetric, or has a group whose
// scale is not finite): one integer 1 <= z <= 2^bits, the same for every group of every row.
int tiles_symmetric_zero(const QuantArgs& w);

// 8-bit weights get decode tiles too (q8 layout): the same 16-row tiles, group by group the
// group's 16 scales and 16 biases, then per 4 codes of the group one chunk of [kQ4TileRows
// rows][4 bytes] (byte e of row r in chunk c: code 4c + e, as stored). Only the instruction sets
// with VNNI's vpdpbusd take them: a code up to 255 times 127 overflows vpmaddubsw's 16-bit
// pair sums, which the 4-bit codes never reach.
bool int8_isa_exact_u8(Int8Isa isa);
// Whether w is one the q8 tiles take: 8 bits, group 16, 32, 64 or 128, in a multiple of 32,
// f16 or bf16 scales.
bool int8_tiles8_takes(const QuantArgs& w);
int64_t q8_tiles_bytes(const QuantArgs& w);
// Writes the q8 tiles of w to dst [q8_tiles_bytes(w)] on `pool`, with the kernel's split (first
// touch), symmetric where w.tiles_zero. Throws Unsupported unless int8_tiles8_takes(w), or for a
// w.tiles_zero that is not w's (as repack_q4_tiles).
void repack_q8_tiles(const QuantArgs& w, void* dst, ThreadPool& pool);
// y[n, out] = x[n, in] * dequant(w)^T + bias[out] for an 8-bit w with q8 tiles, any n, x
// rounded as below (two int8 parts per value, steps per 32 values): each row of y the same bits
// alone or in a batch of any size and on both sets. Throws Unsupported otherwise (other w, or an
// isa without VNNI or not on this CPU).
void linear_q8_tiles(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool,
                     Int8Isa isa);

// y[n, out] = x[n, in] * dequant(w)^T + bias[out] (bias may be nullptr), x rounded as above;
// with w.tiles the tile kernel for every n (each row of y the same bits alone or in a batch of
// any size, and on every instruction set), else n == 1 runs the matvec kernel, n > 1 the
// blocked integer GEMM. w must satisfy
// int8_path_takes and isa int8_isa_supported (callers check). Runs on `pool` and blocks.
// How linear_q4_int8 rounds x per block of 32 values (step d = max|x| / 127, h = round(x / d)):
// split16 also keeps the low part l = round((x - d h) * 256 / d), x ~= (d / 256)(256 h + l) to
// within d / 512; int8 keeps x ~= d h alone (to within d / 2), as llama.cpp's Q8 activations do,
// for half the integer work (OSPREY_CPU_Q4_ACTIVATIONS).
enum class Int8Activations { split16, int8 };
void linear_q4_int8(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool,
                    Int8Isa isa, Int8Activations act = Int8Activations::split16);

}  // namespace osprey::cpu
