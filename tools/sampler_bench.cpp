// CPU sampler time per token (sample/sampler.h) at Llama 3's vocabulary of 128,256 tokens.
// Usage: osprey_sampler_bench [DRAWS]   (default 400 draws per row)
// Rows: settings x logits, where "peaked" logits are N(0, 3^2) with 8 tokens raised to
// [12, 20] (a model's usual next-token logits: a few candidates above a wide bulk) and "flat"
// logits N(0, 0.1^2) (every token about as likely: the slowest case for the cuts and the
// draw). Eight rows of logits are drawn and cycled; prints the median and mean milliseconds
// per token and the size of the kept set of the first row.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "sample/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kVocab = 128256;
constexpr int kRows = 8;

std::vector<std::vector<float>> make_logits(bool peaked, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> bulk(0.0f, peaked ? 3.0f : 0.1f);
  std::uniform_real_distribution<float> high(12.0f, 20.0f);
  std::uniform_int_distribution<size_t> pick(0, kVocab - 1);
  std::vector<std::vector<float>> rows(kRows, std::vector<float>(kVocab));
  for (auto& row : rows) {
    for (float& v : row) v = bulk(rng);
    if (peaked)
      for (int i = 0; i < 8; ++i) row[pick(rng)] = high(rng);
  }
  return rows;
}

struct Setting {
  const char* name;
  osprey::SamplerParams params;
};

osprey::SamplerParams params(float temp, int top_k, float top_p, float min_p = 0.0f, float typical_p = 1.0f) {
  osprey::SamplerParams p;
  p.temperature = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.typical_p = typical_p;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int draws = argc > 1 ? std::max(1, std::atoi(argv[1])) : 400;
  const std::vector<Setting> settings = {
      {"greedy", params(0.0f, 0, 1.0f)},
      {"T 0.8, top-p 0.95", params(0.8f, 0, 0.95f)},
      {"T 0.8, top-k 40", params(0.8f, 40, 1.0f)},
      {"T 0.8, top-k 40, top-p 0.95, min-p 0.05", params(0.8f, 40, 0.95f, 0.05f)},
      {"T 0.8, min-p 0.05", params(0.8f, 0, 1.0f, 0.05f)},
      {"T 0.8, top-p 0.95, typical-p 0.95", params(0.8f, 0, 0.95f, 0.0f, 0.95f)},
      {"T 0.8 (no cut)", params(0.8f, 0, 1.0f)},
  };
  std::printf("vocabulary %zu, %d draws per row\n", kVocab, draws);
  std::printf("%-42s %-7s %10s %10s %8s\n", "setting", "logits", "median ms", "mean ms", "kept");
  for (bool peaked : {true, false}) {
    const auto rows = make_logits(peaked, peaked ? 1 : 2);
    for (const Setting& s : settings) {
      osprey::Sampler sampler(s.params);
      const size_t kept = sampler.distribution(rows[0], {}).size();
      std::vector<double> ms;
      int32_t sink = 0;
      for (int i = 0; i < draws + 8; ++i) {
        const auto t0 = Clock::now();
        sink += sampler.sample(rows[size_t(i % kRows)], {});
        const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (i >= 8) ms.push_back(dt);  // the first draws warm the scratch
      }
      double mean = 0;
      for (double v : ms) mean += v / double(ms.size());
      std::nth_element(ms.begin(), ms.begin() + long(ms.size() / 2), ms.end());
      std::printf("%-42s %-7s %10.4f %10.4f %8zu%s\n", s.name, peaked ? "peaked" : "flat", ms[ms.size() / 2], mean, kept,
                  sink == -1 ? " " : "");
    }
  }
  return 0;
}
