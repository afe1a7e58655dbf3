#pragma once
// The thread that computes the token masks of a decode step's constrained sequences while the
// backend runs the step. One per scheduler, started on the first constrained step and joined
// when the worker is destroyed; nothing creates a thread per step.
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace osprey::grammar {
class Matcher;
}

namespace osprey {

class MaskWorker {
 public:
  MaskWorker() = default;
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;
  ~MaskWorker();  // stop()s

  // Computes the masks of `matchers` (into their automata's caches) on the worker thread,
  // starting the thread on the first call. Until wait() returns, nothing else may touch these
  // matchers or their automata. At most one batch is in flight: start() after start() without
  // wait() is a logic error (it throws).
  void start(std::vector<grammar::Matcher*> matchers);
  // Waits for the batch started last (returns at once when none is in flight) and rethrows
  // the first error one of its masks threw; the rest of the batch is computed regardless.
  void wait();
  // Joins the thread (a batch in flight is finished first). Idempotent.
  void stop();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<grammar::Matcher*> batch_;  // guarded by mu_
  bool busy_ = false;                     // guarded by mu_: a batch is queued or running
  bool stopping_ = false;                 // guarded by mu_
  std::exception_ptr error_;              // guarded by mu_: the batch's first error
  std::thread thread_;
};

}  // namespace osprey
