// The scheduler's mask worker: masks computed on its thread equal the ones computed inline
// (each token tried on its own), batch after batch on one thread; a start after stop() is
// refused.
#include "serve/mask_worker.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace osprey {
namespace {

using grammar::Automaton;
using grammar::Matcher;

std::shared_ptr<const grammar::TokenTrie> small_vocab() {
  // ids: 0 "a", 1 "ab", 2 "b", 3 "c", 4 "ba"
  return std::make_shared<const grammar::TokenTrie>(std::vector<std::string>{"a", "ab", "b", "c", "ba"},
                                                    std::vector<bool>{});
}

TEST(MaskWorker, ComputesEachBatchOfMasksOnItsThread) {
  auto a = std::make_shared<Automaton>(grammar::parse_gbnf(R"(root ::= "a" "b"* "c")"), small_vocab(),
                                       std::vector<int32_t>{});
  MaskWorker worker;
  worker.wait();  // nothing in flight: returns at once
  std::vector<Matcher> ms(3, Matcher(a));
  ASSERT_TRUE(ms[1].accept(0));
  ASSERT_TRUE(ms[2].accept(1));
  for (int round = 0; round < 3; ++round) {
    std::vector<Matcher*> batch;
    for (Matcher& m : ms) batch.push_back(&m);
    worker.start(batch);
    worker.wait();
    for (Matcher& m : ms) {
      const std::vector<uint64_t>& mask = m.mask();
      for (int32_t id = 0; id < 5; ++id) {
        Matcher probe = m;
        EXPECT_EQ(grammar::mask_allows(mask, id), probe.accept(id)) << "round " << round << " token " << id;
      }
    }
    ASSERT_TRUE(ms[0].accept(round == 0 ? 0 : 2));  // "a", then "b"s
  }
  worker.stop();
  worker.stop();  // idempotent
  EXPECT_THROW(worker.start({}), std::logic_error);
}

}  // namespace
}  // namespace osprey
