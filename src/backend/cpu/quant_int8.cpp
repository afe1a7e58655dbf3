// linear_q4_int8 (quant_int8.h): 4-bit weights against x rounded to int8.
//
// x is prepared once per call (quantize_row, on the pool's threads for n > 1) as two int8 parts:
// blocks of 32 values get a step d = max|x| / 127, a high part h = round(x / d) in [-127, 127]
// and a low part l = round((x - d h) * 256 / d) (clamped to [-127, 127]), so that
// x ~= (d / 256) (256 h + l) to within d / 512 (d / 256 where clamped); per group, the f32 sum of
// x for the bias term. Each dot product runs on both parts (the high one shifted left by 8 bits
// in int32), which keeps 16 bits of x where 8 alone cost too much accuracy for greedy decoding.
//  - n == 1 (matvec): the 4-bit row is used as stored. A vector of kVecBytes bytes of a row holds
//    2 * kVecBytes codes, the low nibble of byte b being code 2b and the high one code 2b + 1;
//    x is stored per 128 codes as its even codes then its odd ones, so that (low nibbles, even
//    x) and (high nibbles, odd x) meet in u8 x s8 dot products whose 32-bit lane l sums exactly
//    the 8 codes of word l. Each lane then takes its group's scale times its block's step
//    (dw: the step per word) in one f32 FMA. Rows go kTileRows at a time (concurrent streams).
//  - n > 1 (GEMM): per panel of kNR outputs, the codes are unpacked once per call to bytes in
//    [32-code block][4 codes][output] order, so that one vector load feeds kNR / kLanes outputs
//    of 4 codes each and one broadcast of 4 int8 values of x feeds them all; the micro-kernel
//    holds kMR x kNV int32 accumulators for one 32-code block and folds them into f32 ones
//    with the block's scales and steps; at each group's end the bias times the group's sum of x.
// Each instruction set's kernels are quant_int8_kernels.inc compiled under its own target; the
// set is chosen at run time (int8_isa_best), never from the build's flags alone.
#include "backend/cpu/quant_int8.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/x86_intrinsics.h"
#include "core/env.h"
#include "core/error.h"
#include "core/half.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define INT8_X86 1
#endif

namespace osprey::cpu {
namespace {

constexpr int kBlockCodes = 128;  // the matvec's x layout unit (64 bytes of 4-bit codes)
constexpr int kXBlock = 32;       // values of x per int8 step
// Fewest tiles per chunk of the tile kernel, and of repack_q4_tiles (the same split:
// Schedule::first_touch).
constexpr int64_t kTileMinChunk = 2;

// The rows of w as the kernels see them.
struct Q4Rows {
  const QuantArgs& w;
  int64_t bytes_per_row = w.in / 2;
  int64_t n_groups = w.in / w.group_size;

  const uint8_t* bytes(int64_t r) const { return reinterpret_cast<const uint8_t*>(w.packed) + r * bytes_per_row; }
  const uint16_t* scales(int64_t r) const { return static_cast<const uint16_t*>(w.scales) + r * n_groups; }
  const uint16_t* biases(int64_t r) const { return static_cast<const uint16_t*>(w.biases) + r * n_groups; }
};

// With Int8Activations::int8 the low part is left out of every product (the kernels' LO = false):
// x is d h alone, one int8 per value, as llama.cpp's Q8 activations; half the integer work.
//
// x of the matvec: q, ql [q_len] the high and low parts (per 128 codes: the 64 even codes, then
// the 64 odd ones; zero past in), dw [q_len / 8] (the step of each word's block / 256), xsum
// [n_groups].
struct MatvecX {
  const int8_t* q;
  const int8_t* ql;
  const float* dw;
  const float* xsum;
};

// x of the GEMM, row-major: q, ql [n, q_stride] the high and low parts in code order, d [n,
// d_stride] (the step per 32 values / 256), xsum [n, xsum_stride] (the sum per group).
struct GemmX {
  const int8_t* q;
  const int8_t* ql;
  int64_t q_stride;
  const float* d;
  int64_t d_stride;
  const float* xsum;
  int64_t xsum_stride;
};

struct Prepared {
  MatvecX mv;
  GemmX gm;
};

// One row of x [in] -> the high and low parts q, ql (in code order, or with interleave in the
// matvec's layout: per 128 codes the even ones, then the odd ones), d [in / 32] (step / 256),
// xsum [in / g_size]. Each instruction set's kernels bring one (quant_int8_kernels.inc).
using QuantizeRow = void (*)(const float* x, int64_t in, int64_t g_size, int8_t* q, int8_t* ql, float* d,
                             float* xsum, bool interleave);

}  // namespace

#if INT8_X86
// ---- AVX-512: VNNI and BW ------------------------------------------------------------------
#define INT8_AVX512_COMMON                                                                               \
  constexpr int kLanes = 16;                                                                             \
  constexpr int kMR = 4, kNV = 2;                                                                        \
  using IV = __m512i;                                                                                    \
  using FV = __m512;                                                                                     \
  using Acc = __m512i;                                                                                   \
  inline IV load_i(const void* p) { return _mm512_loadu_si512(p); }                                      \
  inline IV set1_i32(int32_t v) { return _mm512_set1_epi32(v); }                                         \
  inline IV low_nibbles(IV w) { return _mm512_and_si512(w, _mm512_set1_epi8(0x0f)); }                    \
  inline IV high_nibbles(IV w) { return _mm512_and_si512(_mm512_srli_epi16(w, 4), _mm512_set1_epi8(0x0f)); } \
  inline Acc acc_zero() { return _mm512_setzero_si512(); }                                               \
  inline IV combine(IV hi, IV lo) { return _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo); }             \
  inline FV zero_f() { return _mm512_setzero_ps(); }                                                     \
  inline FV set1_f(float f) { return _mm512_set1_ps(f); }                                                \
  inline FV load_f(const float* p) { return _mm512_loadu_ps(p); }                                        \
  inline void store_f(float* p, FV v) { _mm512_storeu_ps(p, v); }                                        \
  inline FV fma_f(FV a, FV b, FV c) { return _mm512_fmadd_ps(a, b, c); }                                 \
  inline FV mul_f(FV a, FV b) { return _mm512_mul_ps(a, b); }                                            \
  inline FV add_f(FV a, FV b) { return _mm512_add_ps(a, b); }                                            \
  inline FV to_f(IV v) { return _mm512_cvtepi32_ps(v); }                                                 \
  inline FV permute_f(const float* p, IV idx) { return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(p)); } \
  inline float reduce_f(FV v) { return _mm512_reduce_add_ps(v); }                                        \
  template <bool BF16>                                                                                   \
  inline FV load_halves(const uint16_t* p) {                                                             \
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));                           \
    if constexpr (BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));     \
    return _mm512_cvtph_ps(h);                                                                           \
  }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#endif
namespace int8_avx512_vnni {
namespace {
INT8_AVX512_COMMON
inline Acc acc_add(Acc a, IV u, IV s) { return _mm512_dpbusd_epi32(a, u, s); }
inline IV acc_finish(Acc a) { return a; }
#include "backend/cpu/quant_int8_kernels.inc"
#include "backend/cpu/quant_int8_tiles.inc"
#include "backend/cpu/quant_int8_tiles8.inc"
}  // namespace
}  // namespace int8_avx512_vnni
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

// The AMX kernels, in the AVX-512 VNNI set's namespace (they call its tile kernels), under the
// same target plus AMX-TILE and AMX-INT8.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8"))), apply_to = function)
#endif
namespace int8_avx512_vnni {
namespace {
#include "backend/cpu/quant_int8_amx.inc"
}  // namespace
}  // namespace int8_avx512_vnni
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#endif
namespace int8_avx512bw {
namespace {
INT8_AVX512_COMMON  // Acc: 16-bit sums of pairs
// NOTE: 16-bit lanes: at most 8 adds of two products 15 * 127 each (30480) before acc_finish.
inline Acc acc_add(Acc a, IV u, IV s) { return _mm512_add_epi16(a, _mm512_maddubs_epi16(u, s)); }
inline IV acc_finish(Acc a) { return _mm512_madd_epi16(a, _mm512_set1_epi16(1)); }
#include "backend/cpu/quant_int8_kernels.inc"
#include "backend/cpu/quant_int8_tiles.inc"
}  // namespace
}  // namespace int8_avx512bw
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

// ---- 256-bit: AVX-VNNI and AVX2 -----------------------------------------------------------
#define INT8_AVX256_COMMON                                                                        \
  constexpr int kLanes = 8;                                                                              \
  constexpr int kMR = 2, kNV = 2;                                                                        \
  using IV = __m256i;                                                                                    \
  using FV = __m256;                                                                                     \
  using Acc = __m256i;                                                                                   \
  inline IV load_i(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }         \
  inline IV set1_i32(int32_t v) { return _mm256_set1_epi32(v); }                                         \
  inline IV low_nibbles(IV w) { return _mm256_and_si256(w, _mm256_set1_epi8(0x0f)); }                    \
  inline IV high_nibbles(IV w) { return _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi8(0x0f)); } \
  inline Acc acc_zero() { return _mm256_setzero_si256(); }                                               \
  inline IV combine(IV hi, IV lo) { return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo); }             \
  inline FV zero_f() { return _mm256_setzero_ps(); }                                                     \
  inline FV set1_f(float f) { return _mm256_set1_ps(f); }                                                \
  inline FV load_f(const float* p) { return _mm256_loadu_ps(p); }                                       \
  inline void store_f(float* p, FV v) { _mm256_storeu_ps(p, v); }                                        \
  inline FV fma_f(FV a, FV b, FV c) { return _mm256_fmadd_ps(a, b, c); }                                 \
  inline FV mul_f(FV a, FV b) { return _mm256_mul_ps(a, b); }                                            \
  inline FV add_f(FV a, FV b) { return _mm256_add_ps(a, b); }                                            \
  inline FV to_f(IV v) { return _mm256_cvtepi32_ps(v); }                                                 \
  inline FV permute_f(const float* p, IV idx) { return _mm256_permutevar8x32_ps(_mm256_loadu_ps(p), idx); } \
  inline float reduce_f(FV v) {                                                                          \
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));                       \
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                                              \
    s = _mm_add_ss(s, _mm_movehdup_ps(s));                                                               \
    return _mm_cvtss_f32(s);                                                                             \
  }                                                                                                      \
  template <bool BF16>                                                                                   \
  inline FV load_halves(const uint16_t* p) {                                                             \
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));                              \
    if constexpr (BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));     \
    return _mm256_cvtph_ps(h);                                                                           \
  }

#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avxvnni,avx2,fma,f16c"))), apply_to = function)
#endif
namespace int8_avx_vnni {
namespace {
INT8_AVX256_COMMON
inline Acc acc_add(Acc a, IV u, IV s) { return _mm256_dpbusd_avx_epi32(a, u, s); }
inline IV acc_finish(Acc a) { return a; }
#include "backend/cpu/quant_int8_kernels.inc"
#include "backend/cpu/quant_int8_tiles.inc"
#include "backend/cpu/quant_int8_tiles8.inc"
}  // namespace
}  // namespace int8_avx_vnni
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#endif
namespace int8_avx2 {
namespace {
INT8_AVX256_COMMON
// NOTE: 16-bit lanes: at most 8 adds of two products 15 * 127 each (30480) before acc_finish.
inline Acc acc_add(Acc a, IV u, IV s) { return _mm256_add_epi16(a, _mm256_maddubs_epi16(u, s)); }
inline IV acc_finish(Acc a) { return _mm256_madd_epi16(a, _mm256_set1_epi16(1)); }
#include "backend/cpu/quant_int8_kernels.inc"
#include "backend/cpu/quant_int8_tiles.inc"
}  // namespace
}  // namespace int8_avx2
#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#undef INT8_AVX256_COMMON
#endif  // INT8_X86

namespace {
constexpr size_t kInt8Isas = size_t(Int8Isa::amx) + 1;
// The sets in the order int8_isa_best prefers them.
constexpr Int8Isa kIsasByPreference[] = {Int8Isa::amx, Int8Isa::avx512_vnni, Int8Isa::avx512bw, Int8Isa::avx_vnni,
                                         Int8Isa::avx2};

#if INT8_X86
// Whether the OS saves the AMX tile configuration and data (XCR0 bits 17 and 18).
bool os_saves_tile_state() {
  unsigned r[4] = {};
  if (!__get_cpuid_count(1, 0, &r[0], &r[1], &r[2], &r[3]) || ((r[2] >> 27) & 1u) == 0) return false;  // OSXSAVE
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}

// Linux hands the tile data state to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); the permission is the whole process's.
bool request_tile_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

// Supported, and for AMX asked for by OSPREY_CPU_AMX=1 (off by default: on the AMX Xeon measured
// it is faster than AVX-512 VNNI, but not by the margin the default waits for; docs/design.md,
// "AMX-INT8"); asking for AMX where it is not offered is an error.
bool isa_enabled(Int8Isa isa) {
  if (isa != Int8Isa::amx) return int8_isa_supported(isa);
  if (env_options().cpu_amx != true) return false;
  if (!int8_isa_supported(isa))
    throw Unsupported("OSPREY_CPU_AMX=1: this CPU (or its OS) does not offer AMX-INT8 with AVX-512 VNNI; unset it "
                      "or set 0");
  return true;
}
}  // namespace

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::avx2: return "avx2";
    case Int8Isa::avx_vnni: return "avx-vnni";
    case Int8Isa::avx512bw: return "avx512bw";
    case Int8Isa::avx512_vnni: return "avx512-vnni";
    case Int8Isa::amx: return "amx-int8";
  }
  return "?";
}

bool int8_isa_supported(Int8Isa isa) {
#if INT8_X86
  // NOTE: CPUID is read once: the linear ops check the set on every call, and under a
  // hypervisor each CPUID is a trap (3% of a 4-bit decode step on a KVM guest).
  static const std::array<bool, kInt8Isas> supported = [] {
    __builtin_cpu_init();
    // f16c and avxvnni by CPUID: clang 14's __builtin_cpu_supports does not know them.
    auto cpuid_bit = [](unsigned leaf, unsigned subleaf, int reg, int bit) {
      unsigned r[4] = {};
      if (!__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3])) return false;
      return ((r[reg] >> bit) & 1u) != 0;
    };
    const bool f16c = cpuid_bit(1, 0, 2, 29);     // CPUID.1:ECX.F16C[bit 29]
    const bool avx_vnni = cpuid_bit(7, 1, 0, 4);  // CPUID.(EAX=7,ECX=1):EAX.AVX-VNNI[bit 4]
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    std::array<bool, kInt8Isas> s{};
    s[size_t(Int8Isa::avx2)] = avx2;
    s[size_t(Int8Isa::avx_vnni)] = avx2 && avx_vnni;
    s[size_t(Int8Isa::avx512bw)] = avx512;
    s[size_t(Int8Isa::avx512_vnni)] = avx512 && __builtin_cpu_supports("avx512vnni");
    // AMX-TILE and AMX-INT8 (CPUID.(EAX=7,ECX=0):EDX bits 24 and 25) and the OS saving the tile
    // state (XCR0 bits 17 and 18); Linux's permission is asked below, when AMX is asked about.
    s[size_t(Int8Isa::amx)] =
        s[size_t(Int8Isa::avx512_vnni)] && cpuid_bit(7, 0, 3, 24) && cpuid_bit(7, 0, 3, 25) && os_saves_tile_state();
    return s;
  }();
  const size_t i = size_t(isa);
  if (i >= supported.size() || !supported[i]) return false;
  if (isa != Int8Isa::amx) return true;
  // NOTE: asked once, and only by a process that asks about AMX (OSPREY_CPU_AMX=1, or a test):
  // the permission makes the kernel size signal frames for the tile state.
  static const bool permitted = request_tile_permission();
  return permitted;
#else
  (void)isa;
  return false;
#endif
}

bool int8_isa_best(Int8Isa* isa) {
  static const int best = [] {
    for (Int8Isa i : kIsasByPreference)
      if (isa_enabled(i)) return int(i);
    return -1;
  }();
  if (best < 0) return false;
  *isa = Int8Isa(best);
  return true;
}

bool int8_isa_best(CpuLevel level, Int8Isa* isa) {
  // Per level, the best set's index, or -1; CPUID is read once.
  static const std::array<int, std::size(kAllCpuLevels)> best = [] {
    std::array<int, std::size(kAllCpuLevels)> b{};
    for (CpuLevel l : kAllCpuLevels) {
      b[size_t(l)] = -1;
      if (l == CpuLevel::scalar) continue;
      for (Int8Isa i : kIsasByPreference) {
        const bool wide = i == Int8Isa::amx || i == Int8Isa::avx512_vnni || i == Int8Isa::avx512bw;
        if ((wide && l == CpuLevel::v3) || !isa_enabled(i)) continue;
        b[size_t(l)] = int(i);
        break;
      }
    }
    return b;
  }();
  if (best[size_t(level)] < 0) return false;
  *isa = Int8Isa(best[size_t(level)]);
  return true;
}

bool int8_path_takes(const QuantArgs& w) {
  return w.bits == 4 && (w.group_size == 32 || w.group_size == 64 || w.group_size == 128) &&
         (w.scale_dtype == DType::f16 || w.scale_dtype == DType::bf16) && w.in % w.group_size == 0;
}

namespace {
// Bytes of a group record's header: scales and biases, or scales alone (symmetric tiles).
int64_t tile_header_bytes(const QuantArgs& w) { return (w.tiles_zero != 0 ? 1 : 2) * kQ4TileRows * 2; }

float half_value(uint16_t h, DType dtype) { return dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h); }

// Whether every group of w has bias == scale * -z in f32 (the tile kernels' product).
bool all_groups_symmetric(const QuantArgs& w, int z) {
  const int64_t n = w.out * (w.in / w.group_size);
  const auto* s = static_cast<const uint16_t*>(w.scales);
  const auto* b = static_cast<const uint16_t*>(w.biases);
  const float neg_zero = -float(z);
  for (int64_t i = 0; i < n; ++i) {
    const float sv = half_value(s[i], w.scale_dtype);
    if (!std::isfinite(sv) || half_value(b[i], w.scale_dtype) != sv * neg_zero) return false;
  }
  return true;
}

// Bytes of the tiles of w (either layout): per 16-row tile and group a header and the group's
// codes, bits / 8 bytes each per row.
int64_t tiles_bytes(const QuantArgs& w) {
  const int64_t n_tiles = (w.out + kQ4TileRows - 1) / kQ4TileRows, n_groups = w.in / w.group_size;
  return n_tiles * n_groups * (tile_header_bytes(w) + int64_t(w.group_size) * w.bits / 8 * kQ4TileRows);
}

// Row r's scale (and bias, unless w.tiles_zero) of one group into its record; zeros for a
// padding row (scale and bias null).
void write_group_header(uint8_t* rec, int r, const QuantArgs& w, const uint16_t* scale, const uint16_t* bias) {
  const uint16_t zero = 0;
  std::memcpy(rec + 2 * r, scale ? scale : &zero, 2);
  if (w.tiles_zero == 0) std::memcpy(rec + 2 * (kQ4TileRows + r), bias ? bias : &zero, 2);
}

// Throws Unsupported when w.tiles_zero is set but is not w's symmetric zero.
void check_tiles_zero(const char* op, const QuantArgs& w) {
  if (w.tiles_zero != 0 && (w.tiles_zero < 0 || w.tiles_zero > (1 << w.bits) || !all_groups_symmetric(w, w.tiles_zero)))
    throw Unsupported(std::string(op) + ": tiles_zero " + std::to_string(w.tiles_zero) +
                      ", but not every group's bias is -" + std::to_string(w.tiles_zero) + " times its scale");
}
}  // namespace

int tiles_symmetric_zero(const QuantArgs& w) {
  if (w.scales == nullptr || w.biases == nullptr || w.out <= 0 || w.in <= 0 || w.group_size <= 0) return 0;
  if (w.scale_dtype != DType::f16 && w.scale_dtype != DType::bf16) return 0;
  // z from the first group with a nonzero scale, then checked on all of them.
  const int64_t n = w.out * (w.in / w.group_size);
  const auto* s = static_cast<const uint16_t*>(w.scales);
  const auto* b = static_cast<const uint16_t*>(w.biases);
  for (int64_t i = 0; i < n; ++i) {
    const float sv = half_value(s[i], w.scale_dtype);
    if (sv == 0.0f) continue;
    const double z = -double(half_value(b[i], w.scale_dtype)) / double(sv);
    if (!(z >= 1.0 && z <= double(1 << w.bits)) || z != std::floor(z)) return 0;
    return all_groups_symmetric(w, int(z)) ? int(z) : 0;
  }
  return 0;  // every scale zero: nothing to gain
}

int64_t q4_tiles_bytes(const QuantArgs& w) { return tiles_bytes(w); }

void repack_q4_tiles(const QuantArgs& w, void* dst, ThreadPool& pool) {
  if (!int8_path_takes(w))
    throw Unsupported("repack_q4_tiles: bits " + std::to_string(w.bits) + ", group_size " +
                      std::to_string(w.group_size) + " (want 4 bits, group 32, 64 or 128, f16 or bf16 scales)");
  check_tiles_zero("repack_q4_tiles", w);
  const int64_t header = tile_header_bytes(w);
  const Q4Rows rows{w};
  const int64_t n_tiles = (w.out + kQ4TileRows - 1) / kQ4TileRows, n_groups = rows.n_groups;
  const int64_t tile_bytes = q4_tiles_bytes(w) / n_tiles, record = tile_bytes / n_groups;
  auto* out = static_cast<uint8_t*>(dst);
  const auto body = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      for (int r = 0; r < kQ4TileRows; ++r) {
        const int64_t row = t * kQ4TileRows + r;
        const bool live = row < w.out;
        const uint8_t* src = live ? rows.bytes(row) : nullptr;
        for (int64_t g = 0; g < n_groups; ++g) {
          uint8_t* rec = out + t * tile_bytes + g * record;
          write_group_header(rec, r, w, live ? rows.scales(row) + g : nullptr, live ? rows.biases(row) + g : nullptr);
          for (int64_t b = 0; b < w.group_size / 32; ++b) {
            // Row r's 16 bytes of this block: code k is nibble k % 2 of byte k / 2.
            const uint8_t* cb = live ? src + (g * w.group_size + b * 32) / 2 : nullptr;
            const auto code = [&](int k) { return live ? (cb[k / 2] >> (4 * (k % 2))) & 0x0f : 0; };
            uint8_t* blk = rec + header + b * 4 * kQ4TileRows * 4;
            for (int c = 0; c < 4; ++c)
              for (int e = 0; e < 4; ++e)
                blk[(c * kQ4TileRows + r) * 4 + e] = uint8_t(code(4 * c + e) | code(16 + 4 * c + e) << 4);
          }
        }
      }
  };
  // NOTE: the tile kernel's split (kTileMinChunk), so that each tile's pages are first touched
  // by the thread that will stream them.
  pool.parallel_for(n_tiles, kTileMinChunk, std::ref(body), Schedule::first_touch);
}

bool int8_isa_exact_u8(Int8Isa isa) {
  return isa == Int8Isa::amx || isa == Int8Isa::avx512_vnni || isa == Int8Isa::avx_vnni;
}

bool int8_tiles8_takes(const QuantArgs& w) {
  return w.bits == 8 && (w.group_size == 16 || w.group_size == 32 || w.group_size == 64 || w.group_size == 128) &&
         (w.scale_dtype == DType::f16 || w.scale_dtype == DType::bf16) && w.in % w.group_size == 0 &&
         w.in % kXBlock == 0;
}

int64_t q8_tiles_bytes(const QuantArgs& w) { return tiles_bytes(w); }

void repack_q8_tiles(const QuantArgs& w, void* dst, ThreadPool& pool) {
  if (!int8_tiles8_takes(w))
    throw Unsupported("repack_q8_tiles: bits " + std::to_string(w.bits) + ", group_size " +
                      std::to_string(w.group_size) + ", in " + std::to_string(w.in) +
                      " (want 8 bits, group 16, 32, 64 or 128, in a multiple of 32, f16 or bf16 scales)");
  check_tiles_zero("repack_q8_tiles", w);
  const int64_t header = tile_header_bytes(w);
  const int64_t n_tiles = (w.out + kQ4TileRows - 1) / kQ4TileRows, n_groups = w.in / w.group_size;
  const int64_t tile_bytes = q8_tiles_bytes(w) / n_tiles, record = tile_bytes / n_groups;
  const auto* codes = reinterpret_cast<const uint8_t*>(w.packed);  // 8 bits: code k of a row is its byte k
  const auto* scales = static_cast<const uint16_t*>(w.scales);
  const auto* biases = static_cast<const uint16_t*>(w.biases);
  auto* out = static_cast<uint8_t*>(dst);
  const auto body = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      for (int r = 0; r < kQ4TileRows; ++r) {
        const int64_t row = t * kQ4TileRows + r;
        const bool live = row < w.out;
        for (int64_t g = 0; g < n_groups; ++g) {
          uint8_t* rec = out + t * tile_bytes + g * record;
          write_group_header(rec, r, w, live ? scales + row * n_groups + g : nullptr,
                             live ? biases + row * n_groups + g : nullptr);
          // Chunk c holds codes 4c .. 4c + 3 of the group, 4 bytes per row.
          uint8_t* chunks = rec + header;
          for (int64_t c = 0; c < w.group_size / 4; ++c) {
            uint8_t* dst_row = chunks + (c * kQ4TileRows + r) * 4;
            if (live)
              std::memcpy(dst_row, codes + row * w.in + g * w.group_size + 4 * c, 4);
            else
              std::memset(dst_row, 0, 4);
          }
        }
      }
  };
  pool.parallel_for(n_tiles, kTileMinChunk, std::ref(body), Schedule::first_touch);
}

namespace {
// x rounded in code order for the tile kernels and the GEMM: n rows into the calling thread's
// thread_local buffers, on the pool's threads for a prompt's many rows.
GemmX round_rows(const float* x, int64_t n, const QuantArgs& w, QuantizeRow quantize_row, ThreadPool& pool) {
  thread_local std::vector<int8_t> q_buf, ql_buf;
  thread_local std::vector<float> d_buf, xsum_buf;
  const int64_t in = w.in, n_groups = w.in / w.group_size, d_stride = in / kXBlock;
  if (int64_t(q_buf.size()) < n * in) q_buf.resize(size_t(n * in));
  if (int64_t(ql_buf.size()) < n * in) ql_buf.resize(size_t(n * in));
  if (int64_t(d_buf.size()) < n * d_stride) d_buf.resize(size_t(n * d_stride));
  if (int64_t(xsum_buf.size()) < n * n_groups) xsum_buf.resize(size_t(n * n_groups));
  int8_t* q = q_buf.data();
  int8_t* ql = ql_buf.data();
  float* d = d_buf.data();
  float* xsum = xsum_buf.data();
  const auto rows = [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i)
      quantize_row(x + i * in, in, w.group_size, q + i * in, ql + i * in, d + i * d_stride, xsum + i * n_groups, false);
  };
  // NOTE: a decode step's few rows stay on the calling thread (no hand-off for microseconds of
  // work); passed through std::ref so that std::function does not allocate.
  pool.parallel_for(n, 16, std::ref(rows));
  return GemmX{q_buf.data(), ql_buf.data(), in, d_buf.data(), d_stride, xsum_buf.data(), n_groups};
}
}  // namespace

void linear_q8_tiles(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool,
                     Int8Isa isa) {
  if (!int8_tiles8_takes(w) || w.tiles == nullptr)
    throw Unsupported("linear_q8_tiles: bits " + std::to_string(w.bits) + ", group_size " +
                      std::to_string(w.group_size) + (w.tiles ? "" : ", no tiles") +
                      " (want 8 bits, group 16, 32, 64 or 128, the tiles of repack_q8_tiles)");
  if (!int8_isa_exact_u8(isa) || !int8_isa_supported(isa))
    throw Unsupported(std::string("linear_q8_tiles: ") + int8_isa_name(isa) +
                      (int8_isa_exact_u8(isa) ? " is not on this CPU" : " has no exact u8 x s8 dot product (VNNI)"));
  if (n <= 0 || w.out <= 0) return;
#if INT8_X86
  const bool wide = isa != Int8Isa::avx_vnni;  // AVX-512 VNNI, or AMX with it
  const GemmX gx =
      round_rows(x, n, w, wide ? &int8_avx512_vnni::quantize_row : &int8_avx_vnni::quantize_row, pool);
  if (isa == Int8Isa::amx && n >= int8_avx512_vnni::kAmxRows)
    int8_avx512_vnni::run_tiles8_amx(w, gx, n, bias, y, pool);
  else if (wide)
    int8_avx512_vnni::run_tiles8(w, gx, n, bias, y, pool);
  else
    int8_avx_vnni::run_tiles8(w, gx, n, bias, y, pool);
#endif
}

void linear_q4_int8(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, ThreadPool& pool,
                    Int8Isa isa, Int8Activations act) {
  const bool lo = act == Int8Activations::split16;
  if (!int8_path_takes(w))
    throw Unsupported("linear_q4_int8: bits " + std::to_string(w.bits) + ", group_size " +
                      std::to_string(w.group_size) + " (want 4 bits, group 32, 64 or 128, f16 or bf16 scales)");
  if (!int8_isa_supported(isa))
    throw Unsupported(std::string("linear_q4_int8: this CPU lacks ") + int8_isa_name(isa));
  if (n <= 0 || w.out <= 0) return;
  const Q4Rows rows{w};
  const int64_t in = w.in, n_groups = rows.n_groups;
  QuantizeRow quantize_row = nullptr;
#if INT8_X86
  switch (isa) {
    case Int8Isa::amx:
    case Int8Isa::avx512_vnni: quantize_row = &int8_avx512_vnni::quantize_row; break;
    case Int8Isa::avx512bw: quantize_row = &int8_avx512bw::quantize_row; break;
    case Int8Isa::avx_vnni: quantize_row = &int8_avx_vnni::quantize_row; break;
    case Int8Isa::avx2: quantize_row = &int8_avx2::quantize_row; break;
  }
#endif
  Prepared px{};
  // NOTE: thread_local of the calling thread; workers reach it through `px` only.
  thread_local std::vector<int8_t> q_buf, ql_buf;
  thread_local std::vector<float> d_buf, dw_buf, xsum_buf;
  if (w.tiles != nullptr) {
    // Rounded in code order (the GEMM's layout).
    const GemmX gx = round_rows(x, n, w, quantize_row, pool);
#if INT8_X86
    switch (isa) {
      case Int8Isa::amx:
        if (n >= int8_avx512_vnni::kAmxRows) {
          int8_avx512_vnni::run_tiles_amx(w, gx, n, bias, y, pool, lo);
          return;
        }
        [[fallthrough]];
      case Int8Isa::avx512_vnni: int8_avx512_vnni::run_tiles(w, gx, n, bias, y, pool, lo); return;
      case Int8Isa::avx512bw: int8_avx512bw::run_tiles(w, gx, n, bias, y, pool, lo); return;
      case Int8Isa::avx_vnni: int8_avx_vnni::run_tiles(w, gx, n, bias, y, pool, lo); return;
      case Int8Isa::avx2: int8_avx2::run_tiles(w, gx, n, bias, y, pool, lo); return;
    }
#endif
    return;
  }
  if (n == 1) {
    const int64_t q_len = (in + kBlockCodes - 1) / kBlockCodes * kBlockCodes;
    if (int64_t(q_buf.size()) < q_len) q_buf.resize(size_t(q_len));
    if (int64_t(ql_buf.size()) < q_len) ql_buf.resize(size_t(q_len));
    if (int64_t(d_buf.size()) < in / kXBlock) d_buf.resize(size_t(in / kXBlock));
    if (int64_t(dw_buf.size()) < q_len / 8) dw_buf.resize(size_t(q_len / 8));
    if (int64_t(xsum_buf.size()) < n_groups) xsum_buf.resize(size_t(n_groups));
    // The last 128-code block's codes past in stay zero.
    const int64_t last = in / kBlockCodes * kBlockCodes;
    std::fill(q_buf.begin() + last, q_buf.begin() + q_len, int8_t(0));
    std::fill(ql_buf.begin() + last, ql_buf.begin() + q_len, int8_t(0));
    quantize_row(x, in, w.group_size, q_buf.data(), ql_buf.data(), d_buf.data(), xsum_buf.data(), true);
    for (int64_t word = 0; word < q_len / 8; ++word)
      dw_buf[size_t(word)] = word * 8 < in ? d_buf[size_t(word * 8 / kXBlock)] : 0.0f;
    px.mv = {q_buf.data(), ql_buf.data(), dw_buf.data(), xsum_buf.data()};
  } else {
    px.gm = round_rows(x, n, w, quantize_row, pool);
  }
#if INT8_X86
  switch (isa) {
    case Int8Isa::amx:  // without tiles, as AVX-512 VNNI
    case Int8Isa::avx512_vnni: int8_avx512_vnni::run(rows, px, n, bias, y, pool, lo); return;
    case Int8Isa::avx512bw: int8_avx512bw::run(rows, px, n, bias, y, pool, lo); return;
    case Int8Isa::avx_vnni: int8_avx_vnni::run(rows, px, n, bias, y, pool, lo); return;
    case Int8Isa::avx2: int8_avx2::run(rows, px, n, bias, y, pool, lo); return;
  }
#endif
}

}  // namespace osprey::cpu
