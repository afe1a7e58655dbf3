// osprey serve's flags: values out of range are usage errors (exit 2) naming the flag, before
// any model loads.
#include <gtest/gtest.h>

#include "support/test_util.h"

namespace osprey {
namespace {

using testing::run_osprey;

void expect_usage_error(const std::string& flags, const std::string& name) {
  auto r = run_osprey("serve --port 0 " + flags);
  EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.err;
  EXPECT_NE(r.err.find(name), std::string::npos) << flags << ": " << r.err;
}

}  // namespace

TEST(CliServe, BadBatchingFlagsAreUsageErrors) {
  expect_usage_error("--kv-layout ring", "--kv-layout");
  expect_usage_error("--block-size 0", "--block-size");
  expect_usage_error("--block-size 4096", "--block-size");
  expect_usage_error("--kv-cache-mib -1", "--kv-cache-mib");
  expect_usage_error("--prefill-chunk 0", "--prefill-chunk");
  expect_usage_error("-np 0", "--parallel");
}

}  // namespace osprey
