// The choice of the CPU kernels' level (cpu_level.h) and the entry points of backend/cpu/
// (cpu_kernels.h, basic_ops.h, quant_kernels.h), which call the chosen level's kernels
// through its KernelTable: one load of the table's address and one indirect call per op.
#include "backend/cpu_level.h"

#include <atomic>
#include <mutex>

#include "backend/cpu/kernel_table.h"
#include "core/env.h"
#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace osprey {
namespace {

#if defined(__x86_64__)
// CPUID leaf `leaf`, subleaf `sub` as {eax, ebx, ecx, edx}; zeros past the highest leaf.
struct CpuidRegs {
  unsigned r[4] = {};
  bool bit(int reg, int b) const { return ((r[reg] >> b) & 1u) != 0; }
};
CpuidRegs cpuid(unsigned leaf, unsigned sub) {
  CpuidRegs c;
  if (!__get_cpuid_count(leaf, sub, &c.r[0], &c.r[1], &c.r[2], &c.r[3])) c = {};
  return c;
}
constexpr int kEax = 0, kEbx = 1, kEcx = 2, kEdx = 3;

// The levels' features by CPUID (Intel SDM vol. 2A, CPUID; the x86-64 psABI's levels), and
// whether the OS saves the vector state (XCR0 by XGETBV: bits 1-2 for YMM, 5-7 for AVX-512).
CpuLevel detect_best_level() {
  const CpuidRegs l1 = cpuid(1, 0), l7 = cpuid(7, 0), l7s1 = cpuid(7, 1), e1 = cpuid(0x80000001u, 0);
  const bool v2 = l1.bit(kEcx, 0) && l1.bit(kEcx, 9) && l1.bit(kEcx, 13) && l1.bit(kEcx, 19) &&  // SSE3 SSSE3 CX16 SSE4.1
                  l1.bit(kEcx, 20) && l1.bit(kEcx, 23) && e1.bit(kEcx, 0);                       // SSE4.2 POPCNT LAHF
  uint64_t xcr0 = 0;
  if (l1.bit(kEcx, 27)) {  // OSXSAVE: XGETBV is available
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = uint64_t(hi) << 32 | lo;
  }
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
  const bool v3 = v2 && os_ymm && l1.bit(kEcx, 12) && l1.bit(kEcx, 22) && l1.bit(kEcx, 28) &&  // FMA MOVBE AVX
                  l1.bit(kEcx, 29) && l7.bit(kEbx, 3) && l7.bit(kEbx, 5) && l7.bit(kEbx, 8) &&  // F16C BMI1 AVX2 BMI2
                  e1.bit(kEcx, 5);                                                              // LZCNT
  const bool v4 = v3 && os_zmm && l7.bit(kEbx, 16) && l7.bit(kEbx, 17) && l7.bit(kEbx, 28) &&  // F DQ CD
                  l7.bit(kEbx, 30) && l7.bit(kEbx, 31);                                        // BW VL
  const bool v4_bf16 = v4 && l7s1.bit(kEax, 5) && l7.bit(kEcx, 11);  // AVX512_BF16, AVX512_VNNI
  if (v4_bf16) return CpuLevel::v4_bf16;
  if (v4) return CpuLevel::v4;
  if (v3) return CpuLevel::v3;
  return CpuLevel::scalar;
}
#else
CpuLevel detect_best_level() { return CpuLevel::scalar; }
#endif

const cpu::KernelTable* level_table(CpuLevel level) {
  switch (level) {
    case CpuLevel::scalar: return osprey_cpu_kernels_scalar();
#if defined(__x86_64__)
    case CpuLevel::v3: return osprey_cpu_kernels_v3();
    case CpuLevel::v4: return osprey_cpu_kernels_v4();
    case CpuLevel::v4_bf16: return osprey_cpu_kernels_v4_bf16();
#else
    default: break;
#endif
  }
  throw Unsupported(std::string("CPU level ") + cpu_level_name(level) + ": not built for this architecture");
}

// The chosen level and its table; null until the first choice.
std::atomic<const cpu::KernelTable*> g_table{nullptr};
std::atomic<CpuLevel> g_level{CpuLevel::scalar};
std::mutex g_choose_mu;

void set_level(CpuLevel level) {
  g_level.store(level, std::memory_order_relaxed);
  g_table.store(level_table(level), std::memory_order_release);
}

[[gnu::noinline]] const cpu::KernelTable& choose_from_env() {
  std::lock_guard<std::mutex> lock(g_choose_mu);
  if (const cpu::KernelTable* t = g_table.load(std::memory_order_acquire)) return *t;
  set_level(resolve_cpu_level(env_options().cpu_level, cpu_best_level(), "OSPREY_CPU_LEVEL"));
  return *g_table.load(std::memory_order_acquire);
}


}  // namespace

const char* cpu_level_name(CpuLevel level) {
  switch (level) {
    case CpuLevel::scalar: return "scalar";
    case CpuLevel::v3: return "v3";
    case CpuLevel::v4: return "v4";
    case CpuLevel::v4_bf16: return "v4-bf16";
  }
  return "?";
}

std::optional<CpuLevel> parse_cpu_level(std::string_view name) {
  for (CpuLevel level : kAllCpuLevels)
    if (name == cpu_level_name(level)) return level;
  return std::nullopt;
}

const char* cpu_level_features(CpuLevel level) {
  switch (level) {
    case CpuLevel::scalar: return "x86-64 baseline";
    case CpuLevel::v3: return "AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE";
    case CpuLevel::v4: return "AVX-512 F, BW, CD, DQ, VL";
    case CpuLevel::v4_bf16: return "AVX-512 F, BW, CD, DQ, VL, BF16, VNNI";
  }
  return "?";
}

CpuLevel cpu_best_level() {
  static const CpuLevel best = detect_best_level();
  return best;
}

bool cpu_level_supported(CpuLevel level) { return level <= cpu_best_level(); }

CpuLevel resolve_cpu_level(std::string_view requested, CpuLevel host_best, std::string_view source) {
  if (requested.empty()) return host_best;
  const std::optional<CpuLevel> level = parse_cpu_level(requested);
  const std::string what = std::string(source) + "=" + std::string(requested);
  if (!level)
    throw InvalidInput(what + ": not a CPU level (scalar, v3, v4 or v4-bf16); this CPU's best is " +
                       cpu_level_name(host_best));
  if (*level > host_best)
    throw Unsupported(what + ": this CPU lacks the level (" + cpu_level_features(*level) + "); its best level is " +
                      cpu_level_name(host_best));
  return *level;
}

void select_cpu_level(std::string_view requested) {
  const CpuLevel level = resolve_cpu_level(requested, cpu_best_level(), "OSPREY_CPU_LEVEL");
  std::lock_guard<std::mutex> lock(g_choose_mu);
  set_level(level);
}

CpuLevel cpu_level() {
  cpu::kernels();
  return g_level.load(std::memory_order_relaxed);
}

std::string cpu_level_name() { return cpu_level_name(cpu_level()); }

ScopedCpuLevel::ScopedCpuLevel(CpuLevel level) : previous_(cpu_level()) {
  if (!cpu_level_supported(level))
    throw Unsupported(std::string("CPU level ") + cpu_level_name(level) + ": this CPU lacks the level (" +
                      cpu_level_features(level) + "); its best level is " + cpu_level_name(cpu_best_level()));
  std::lock_guard<std::mutex> lock(g_choose_mu);
  set_level(level);
}

ScopedCpuLevel::~ScopedCpuLevel() {
  std::lock_guard<std::mutex> lock(g_choose_mu);
  set_level(previous_);
}

namespace cpu {

const KernelTable& kernels() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr) [[unlikely]]
    return choose_from_env();
  return *t;
}

}  // namespace cpu
}  // namespace osprey
