#pragma once
// Batch-invariant mode (ops::set_batch_invariant) for a scope: a speculating sequence's steps
// and verifies (docs/design.md, "Speculative decoding"). Turns the process-wide mode on when
// asked and it is off, and puts it back at the end of the scope; a mode already on stays on.
#include "backend/ops.h"

namespace osprey {

class BatchInvariantScope {
 public:
  explicit BatchInvariantScope(bool on) : set_(on && !ops::batch_invariant()) {
    if (set_) ops::set_batch_invariant(true);
  }
  ~BatchInvariantScope() {
    if (set_) ops::set_batch_invariant(false);
  }
  BatchInvariantScope(const BatchInvariantScope&) = delete;
  BatchInvariantScope& operator=(const BatchInvariantScope&) = delete;

 private:
  bool set_;
};

}  // namespace osprey
