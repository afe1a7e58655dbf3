// --device: asking for CUDA where there is none, or for an unknown device, is a clear error.
// (The families' CUDA references run with the CPU ones in tests/model/family_test.cpp.)
#include <gtest/gtest.h>

#include "backend/cuda_available.h"
#include "support/test_util.h"

namespace osprey {

TEST(CudaDevice, AskingForCudaWithoutOneIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  const std::string model = (testing::source_dir() / "tests/fixtures/models/llama").string();
  auto r = testing::run_osprey("generate -m " + model + " --token-ids 1,2 -n 2 --device cuda");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cuda"), std::string::npos) << r.err;
  r = testing::run_osprey("generate -m " + model + " --token-ids 1,2 -n 2 --device tpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("expected cpu, cuda or cuda:N"), std::string::npos) << r.err;
}

}  // namespace osprey
