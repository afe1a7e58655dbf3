#pragma once
// A progress bar on stderr, drawn only when stderr is a terminal.
#include <cstddef>
#include <string>

namespace osprey::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void update(size_t done, size_t total);
  void finish();

 private:
  std::string label_;
  bool enabled_;
  int last_permille_ = -1;
  bool finished_ = false;
};

}  // namespace osprey::cli
