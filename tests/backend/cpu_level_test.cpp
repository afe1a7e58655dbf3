// The CPU kernels' instruction-set levels (backend/cpu_level.h): their names, the host's best
// level against the kernel's own report of the CPU's features (/proc/cpuinfo), the errors for a
// level that is no level or that the host lacks, the scoped override, and OSPREY_CPU_LEVEL in
// the osprey binary, also on emulated older CPUs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "backend/cpu_isa.h"
#include "backend/cpu_level.h"
#include "core/error.h"
#include "support/test_util.h"

namespace osprey {
namespace {

// What a call throws, as text; empty when it does not throw.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return {};
}

TEST(CpuLevel, NamesAreTheSwitchValues) {
  const std::vector<std::string> names = {"scalar", "v3", "v4", "v4-bf16"};
  ASSERT_EQ(std::size(kAllCpuLevels), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(cpu_level_name(kAllCpuLevels[i]), names[i]);
    EXPECT_EQ(parse_cpu_level(names[i]), kAllCpuLevels[i]) << names[i];
  }
  for (const char* bad : {"", "V3", "avx2", "v4_bf16", "native", "x86-64-v3"})
    EXPECT_FALSE(parse_cpu_level(bad).has_value()) << bad;
}

// The flags of the first processor in /proc/cpuinfo (the kernel lists only what it enabled).
std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> flags;
      for (std::string w; words >> w;) flags.insert(w);
      return flags;
    }
  return {};
}

TEST(CpuLevel, HostBestLevelMatchesProcCpuinfo) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "not x86-64";
#else
  const std::set<std::string> flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  auto all = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (!flags.count(n)) return false;
    return true;
  };
  // NOTE: some kernels and sandboxes (gVisor) list no "abm" (LZCNT) for CPUs that have it;
  // then its CPUID bit (leaf 0x80000001, ECX bit 5) stands in.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool lzcnt = flags.count("abm") || (__get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) && (ecx >> 5 & 1u));
  // The x86-64 psABI's levels, in Linux's names (pni: SSE3).
  const bool v2 = all({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"});
  const bool v3 = v2 && lzcnt && all({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"});
  const bool v4 = v3 && all({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"});
  const bool v4_bf16 = v4 && all({"avx512_bf16", "avx512_vnni"});
  const CpuLevel want = v4_bf16 ? CpuLevel::v4_bf16 : v4 ? CpuLevel::v4 : v3 ? CpuLevel::v3 : CpuLevel::scalar;
  EXPECT_EQ(cpu_level_name(cpu_best_level()), std::string(cpu_level_name(want)));
  for (CpuLevel level : kAllCpuLevels) EXPECT_EQ(cpu_level_supported(level), level <= want) << cpu_level_name(level);
#endif
}

TEST(CpuLevel, ResolvesANameOrTheHostsBest) {
  EXPECT_EQ(resolve_cpu_level("", CpuLevel::v3, "OSPREY_CPU_LEVEL"), CpuLevel::v3);
  EXPECT_EQ(resolve_cpu_level("scalar", CpuLevel::v3, "OSPREY_CPU_LEVEL"), CpuLevel::scalar);
  EXPECT_EQ(resolve_cpu_level("v3", CpuLevel::v3, "OSPREY_CPU_LEVEL"), CpuLevel::v3);
  EXPECT_EQ(resolve_cpu_level("v4", CpuLevel::v4_bf16, "OSPREY_CPU_LEVEL"), CpuLevel::v4);
  EXPECT_EQ(resolve_cpu_level("v4-bf16", CpuLevel::v4_bf16, "OSPREY_CPU_LEVEL"), CpuLevel::v4_bf16);
}

TEST(CpuLevel, ALevelTheHostLacksIsAnErrorNamingItsBest) {
  const std::string e =
      message_of<Unsupported>([] { resolve_cpu_level("v4", CpuLevel::v3, "OSPREY_CPU_LEVEL"); });
  EXPECT_NE(e.find("OSPREY_CPU_LEVEL=v4"), std::string::npos) << e;
  EXPECT_NE(e.find("AVX-512"), std::string::npos) << e;
  EXPECT_NE(e.find("best level is v3"), std::string::npos) << e;
  const std::string e2 =
      message_of<Unsupported>([] { resolve_cpu_level("v4-bf16", CpuLevel::v4, "OSPREY_CPU_LEVEL"); });
  EXPECT_NE(e2.find("best level is v4"), std::string::npos) << e2;
  const std::string e3 =
      message_of<Unsupported>([] { resolve_cpu_level("v3", CpuLevel::scalar, "OSPREY_CPU_LEVEL"); });
  EXPECT_NE(e3.find("best level is scalar"), std::string::npos) << e3;
}

TEST(CpuLevel, AnUnknownNameIsAnErrorListingTheLevels) {
  const std::string e =
      message_of<InvalidInput>([] { resolve_cpu_level("avx2", CpuLevel::v4, "OSPREY_CPU_LEVEL"); });
  EXPECT_NE(e.find("OSPREY_CPU_LEVEL=avx2"), std::string::npos) << e;
  EXPECT_NE(e.find("scalar, v3, v4 or v4-bf16"), std::string::npos) << e;
}

TEST(CpuLevel, ScopedLevelRunsTheKernelsAtItAndRestores) {
  const CpuLevel before = cpu_level();
  for (CpuLevel level : kAllCpuLevels) {
    if (!cpu_level_supported(level)) {
      EXPECT_THROW(ScopedCpuLevel{level}, Unsupported) << cpu_level_name(level);
      EXPECT_EQ(cpu_level(), before);
      continue;
    }
    {
      ScopedCpuLevel scope(level);
      EXPECT_EQ(cpu_level(), level);
      EXPECT_EQ(cpu_level_name(), cpu_level_name(level));
    }
    EXPECT_EQ(cpu_level(), before) << "after " << cpu_level_name(level);
  }
}

TEST(CpuLevel, IsaNameFollowsTheLevel) {
  const std::pair<CpuLevel, const char*> words[] = {
      {CpuLevel::scalar, "scalar"}, {CpuLevel::v3, "AVX2"}, {CpuLevel::v4, "AVX-512"}, {CpuLevel::v4_bf16, "AVX-512 BF16"}};
  for (const auto& [level, name] : words) {
    if (!cpu_level_supported(level)) continue;
    ScopedCpuLevel scope(level);
    EXPECT_STREQ(cpu_isa_name(), name) << cpu_level_name(level);
  }
}

TEST(CpuLevel, TheBinaryTakesOsprey_CPU_LEVEL) {
  const std::string model = (testing::source_dir() / "tests/fixtures/models/llama").string();
  const std::string args = "generate -m " + model + " --token-ids 1,2 -n 2";
  testing::CommandResult r = testing::run_osprey(args, "OSPREY_CPU_LEVEL=avx9");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("OSPREY_CPU_LEVEL=avx9"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::string("best is ") + cpu_level_name(cpu_best_level())), std::string::npos) << r.err;
  for (CpuLevel level : kAllCpuLevels) {
    if (!cpu_level_supported(level)) {
      r = testing::run_osprey(args, std::string("OSPREY_CPU_LEVEL=") + cpu_level_name(level));
      EXPECT_EQ(r.exit_code, 1) << cpu_level_name(level);
      EXPECT_NE(r.err.find(std::string("best level is ") + cpu_level_name(cpu_best_level())), std::string::npos)
          << r.err;
      continue;
    }
    r = testing::run_osprey(args, std::string("OSPREY_CPU_LEVEL=") + cpu_level_name(level));
    EXPECT_EQ(r.exit_code, 0) << cpu_level_name(level) << ": " << r.err;
  }
}

TEST(CpuLevel, TheBinaryRunsOnOlderCpus) {
  // The one binary on CPUs older than the host, emulated by qemu's user mode: a plain x86-64
  // CPU (qemu64: no AVX), where only the scalar level can run, and Haswell (AVX2, no AVX-512),
  // whose best is v3. qemu has no AVX-512, so an AVX-512 instruction outside the v4 kernels,
  // or an AVX one outside the kernels, stops the run.
#if !defined(__x86_64__)
  GTEST_SKIP() << "not x86-64";
#endif
  if (std::system("command -v qemu-x86_64 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "qemu-x86_64 is not installed (Debian's qemu-user)";
  const std::string model = (testing::source_dir() / "tests/fixtures/models/llama").string();
  const std::string args = "generate -m " + model + " --token-ids 1,2 -n 4";
  struct Emulated {
    const char* cpu;
    const char* best;
    const char* above;  // the next level up, which it lacks
  };
  for (const Emulated& e : {Emulated{"qemu64", "scalar", "v3"}, Emulated{"Haswell", "v3", "v4"}}) {
    // run_osprey's env is the command line's prefix: the emulator goes before the binary.
    const std::string qemu = std::string("timeout 300 qemu-x86_64 -cpu ") + e.cpu;
    testing::CommandResult r = testing::run_osprey(args, qemu);
    EXPECT_EQ(r.exit_code, 0) << e.cpu << ": " << r.err;
    r = testing::run_osprey(args, std::string("OSPREY_CPU_LEVEL=") + e.best + " " + qemu);
    EXPECT_EQ(r.exit_code, 0) << e.cpu << " at " << e.best << ": " << r.err;
    r = testing::run_osprey(args, std::string("OSPREY_CPU_LEVEL=") + e.above + " " + qemu);
    EXPECT_EQ(r.exit_code, 1) << e.cpu << " at " << e.above;
    EXPECT_NE(r.err.find(std::string("its best level is ") + e.best), std::string::npos) << e.cpu << ": " << r.err;
  }
}

}  // namespace
}  // namespace osprey
