#include "sample/sampler_fields.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

namespace osprey {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxInt = double(INT32_MAX);

// clang-format off
const SamplerField kFields[] = {
  // key                 alias             flag                  help
  {"temperature",        nullptr,          "--temp",             "Temperature (0: greedy)",
   false, 0, kInf, false, true, 2, true, &SamplerParams::temperature, nullptr},
  {"top_k",              nullptr,          "--top-k",            "Top-k (0: off)",
   true, 0, kMaxInt, false, false, 0, true, nullptr, &SamplerParams::top_k},
  {"top_p",              nullptr,          "--top-p",            "Top-p (1: off)",
   false, 0, 1, true, false, 0, true, &SamplerParams::top_p, nullptr},
  {"min_p",              nullptr,          "--min-p",            "Min-p (0: off)",
   false, 0, 1, false, true, 0, true, &SamplerParams::min_p, nullptr},
  {"typical_p",          nullptr,          "--typical-p",        "Locally typical sampling's mass (1: off)",
   false, 0, 1, true, false, 0, true, &SamplerParams::typical_p, nullptr},
  {"repetition_penalty", "repeat_penalty", "--repeat-penalty",   "Repetition penalty (1: off)",
   false, 0, kInf, true, true, 0, true, &SamplerParams::repetition_penalty, nullptr},
  {"repeat_last_n",      nullptr,          "--repeat-last-n",    "Tokens the penalties look back over",
   true, 0, kMaxInt, false, false, 0, false, nullptr, &SamplerParams::repeat_last_n},
  {"presence_penalty",   nullptr,          "--presence-penalty", "Presence penalty: subtracted once from a token seen (0: off)",
   false, -2, 2, false, false, 0, false, &SamplerParams::presence_penalty, nullptr},
  {"frequency_penalty",  nullptr,          "--frequency-penalty", "Frequency penalty: subtracted per time a token was seen (0: off)",
   false, -2, 2, false, false, 0, false, &SamplerParams::frequency_penalty, nullptr},
};
// clang-format on

std::string number_text(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

bool SamplerField::accepts(double v) const {
  if (!std::isfinite(v)) return false;
  if (integer && v != std::floor(v)) return false;
  if (lo_open ? v <= lo : v < lo) return false;
  if (hi_open ? v >= hi : v > hi) return false;
  return true;
}

std::string SamplerField::range_text() const {
  return std::string(lo_open ? "(" : "[") + number_text(lo) + ", " + number_text(hi) + (hi_open ? ")" : "]");
}

std::span<const SamplerField> sampler_fields() { return kFields; }

}  // namespace osprey
