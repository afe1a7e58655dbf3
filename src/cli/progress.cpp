#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace osprey::cli {

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) != 0) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(size_t done, size_t total) {
  if (!enabled_ || finished_ || total == 0) return;
  int permille = int(double(done) / double(total) * 1000.0);
  if (permille == last_permille_) return;
  last_permille_ = permille;
  constexpr int kWidth = 30;
  int filled = permille * kWidth / 1000;
  std::string bar(size_t(filled), '#');
  bar.append(size_t(kWidth - filled), '-');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %8.1f MiB", label_.c_str(), bar.c_str(), permille / 10.0,
               double(total) / (1024.0 * 1024.0));
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (last_permille_ >= 0) std::fprintf(stderr, "\n");
}

}  // namespace osprey::cli
