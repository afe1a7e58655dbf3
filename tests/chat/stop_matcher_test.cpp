#include <gtest/gtest.h>

#include "chat/stop_matcher.h"

namespace osprey {

TEST(StopMatcher, HoldsBackAPossibleStartAndCutsTheMatch) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("abc E"), "abc ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("Dx"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesHeldTextWhenTheMatchFails) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("E"), "");
  EXPECT_EQ(m.push("Nd"), "ENd");
  EXPECT_EQ(m.push("EN"), "");
  EXPECT_EQ(m.flush(), "EN");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, TheEarliestOfSeveralStopsWins) {
  StopMatcher m({"cd", "b"});
  EXPECT_EQ(m.matched(), "");
  EXPECT_EQ(m.push("abcd"), "a");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "b");
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, NoStopsPassesEverything) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
}

}  // namespace osprey
