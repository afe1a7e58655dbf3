#pragma once
// "Did you mean" for the CLI: the known name nearest to a mistyped one.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::cli {

// Levenshtein distance: the fewest single-character insertions, deletions and substitutions
// that turn `a` into `b`.
size_t edit_distance(std::string_view a, std::string_view b);

// The name in `known` nearest to `typed` ("generat" -> "generate", "--temperature" ->
// "--temp", "--n_predict" -> "--n-predict"), or "" when none is near. Leading dashes are
// ignored. A name is near when one of the two, 3 characters at least, begins the other, or
// when their edit distance is at most max(2, length of `typed` / 3). Prefixes rank first, then
// the smaller distance, then the order of `known`.
std::string closest_name(std::string_view typed, const std::vector<std::string>& known);

}  // namespace osprey::cli
