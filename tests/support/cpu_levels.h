#pragma once
// CPU op tests run at every instruction-set level of the kernels (backend/cpu_level.h) that the
// host has, and skip, naming it, each level it lacks.
//  - CpuLevelTest: a fixture parameterised by the level (INSTANTIATE_TEST_SUITE_P(CpuLevels,
//    Suite, OSPREY_ALL_CPU_LEVELS)), for what only the CPU kernels have.
//  - Suites parameterised by device run at each level too: support/device_test.h.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "backend/cpu_level.h"

namespace osprey::testing {

// A level as a test-name part: cpu_level_name with '-' as '_' (v4-bf16 -> v4_bf16).
inline std::string cpu_level_param_name(CpuLevel level) {
  std::string s = cpu_level_name(level);
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

// Runs the kernels at `level` until `scope` is reset or destroyed. Returns why the test must
// skip when the host lacks the level (scope left empty), else an empty string.
inline std::string enter_cpu_level(CpuLevel level, std::optional<ScopedCpuLevel>& scope) {
  if (!cpu_level_supported(level))
    return std::string("this CPU lacks the ") + cpu_level_name(level) + " level (" + cpu_level_features(level) +
           "); its best is " + cpu_level_name(cpu_best_level());
  scope.emplace(level);
  return {};
}

class CpuLevelTest : public ::testing::TestWithParam<CpuLevel> {
 protected:
  void SetUp() override {
    if (const std::string skip = enter_cpu_level(GetParam(), level_); !skip.empty()) GTEST_SKIP() << skip;
  }

 private:
  std::optional<ScopedCpuLevel> level_;
};

#define OSPREY_ALL_CPU_LEVELS                                   \
  ::testing::ValuesIn(::osprey::kAllCpuLevels),                  \
      [](const ::testing::TestParamInfo<::osprey::CpuLevel>& i) { \
        return ::osprey::testing::cpu_level_param_name(i.param); \
      }

}  // namespace osprey::testing
