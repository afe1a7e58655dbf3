#include "cli/suggest.h"

#include <algorithm>
#include <numeric>

namespace osprey::cli {
namespace {

std::string_view strip_dashes(std::string_view s) {
  while (!s.empty() && s.front() == '-') s.remove_prefix(1);
  return s;
}

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t(0));
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];  // row[i - 1][j - 1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string closest_name(std::string_view typed, const std::vector<std::string>& known) {
  const std::string_view t = strip_dashes(typed);
  const size_t limit = std::max<size_t>(2, t.size() / 3);
  std::string best;
  bool best_prefix = false;
  size_t best_distance = 0;
  for (const std::string& name : known) {
    const std::string_view k = strip_dashes(name);
    const size_t shorter = std::min(t.size(), k.size());
    const bool prefix = shorter >= 3 && (t.substr(0, shorter) == k.substr(0, shorter));
    const size_t distance = edit_distance(t, k);
    if (!prefix && distance > limit) continue;
    if (best.empty() || (prefix && !best_prefix) || (prefix == best_prefix && distance < best_distance)) {
      best = name;
      best_prefix = prefix;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace osprey::cli
