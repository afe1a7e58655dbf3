#pragma once
// The instruction-set levels the CPU kernels (backend/cpu/) are built for, and the choice of
// one at run time. The kernels are compiled once per level; the rest of the program for plain
// x86-64. The process runs the host's best level (CPUID, with XGETBV for the OS's support of
// the vector state), or the one OSPREY_CPU_LEVEL names.
#include <optional>
#include <string>
#include <string_view>

namespace osprey {

// In ascending order: a level's code runs on any CPU that has the next one's.
enum class CpuLevel {
  scalar,   // x86-64 baseline (SSE2): the kernels' scalar paths
  v3,       // x86-64-v3: AVX2, FMA, F16C (and BMI1/2, LZCNT, MOVBE)
  v4,       // x86-64-v4: AVX-512 F, BW, CD, DQ, VL
  v4_bf16,  // x86-64-v4 with AVX-512 BF16 and VNNI
};

inline constexpr CpuLevel kAllCpuLevels[] = {CpuLevel::scalar, CpuLevel::v3, CpuLevel::v4, CpuLevel::v4_bf16};

// "scalar", "v3", "v4", "v4-bf16": the names OSPREY_CPU_LEVEL takes.
const char* cpu_level_name(CpuLevel level);
// The level named `name` (as cpu_level_name spells it), or nullopt.
std::optional<CpuLevel> parse_cpu_level(std::string_view name);
// What a level needs of the CPU, in words ("AVX-512 F, BW, CD, DQ, VL").
const char* cpu_level_features(CpuLevel level);

// The best level this build has kernels for that the running CPU and OS support (scalar off
// x86-64).
CpuLevel cpu_best_level();
bool cpu_level_supported(CpuLevel level);

// The level that `requested` names (empty: host_best) on a host whose best is host_best.
// Throws InvalidInput for a name that is no level, Unsupported for a level above host_best;
// both messages name `source` (the variable or flag) and the host's best level.
CpuLevel resolve_cpu_level(std::string_view requested, CpuLevel host_best, std::string_view source);

// Makes the level OSPREY_CPU_LEVEL's value `requested` names (empty: the host's best) the
// one every later kernel call runs; throws as resolve_cpu_level. Without a call, the first
// kernel call takes env_options().cpu_level. Not while kernels run on other threads.
void select_cpu_level(std::string_view requested);

// The level the kernels run (choosing it as above if no call has yet) and its name.
CpuLevel cpu_level();
std::string cpu_level_name();

// For tests and benchmarks: runs the kernels at `level` until destroyed, then the level
// before. Throws Unsupported when the host lacks `level`. Not while kernels run on other
// threads.
class ScopedCpuLevel {
 public:
  explicit ScopedCpuLevel(CpuLevel level);
  ~ScopedCpuLevel();
  ScopedCpuLevel(const ScopedCpuLevel&) = delete;
  ScopedCpuLevel& operator=(const ScopedCpuLevel&) = delete;

 private:
  CpuLevel previous_;
};

}  // namespace osprey
