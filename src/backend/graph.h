#pragma once
// Captured device work, replayed as one launch (CUDA graphs). A capture runs the host code of
// `fn` once while the device work it enqueues on the device's stream is recorded instead of
// run; replay() enqueues that work again, reading and writing the same device addresses.
// Buffers allocated during the capture are held by the graph until it is destroyed, so no
// later allocation can take their addresses.
#include <functional>
#include <memory>

#include "core/device.h"

namespace osprey {

class CapturedGraph {
 public:
  // Throws Unsupported for a CPU device or a build without CUDA; rethrows fn's exception
  // (the capture is then abandoned and nothing was enqueued).
  static std::unique_ptr<CapturedGraph> capture(Device device, const std::function<void()>& fn);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // Enqueues the recorded work on the device's stream; returns at once.
  void replay();

  // Changes whenever the device's scratch memory moves; a graph captured under another value
  // must not be replayed.
  static uint64_t memory_generation(Device device);

  struct Impl;

 private:
  explicit CapturedGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey
