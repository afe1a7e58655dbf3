// The CPU's quantized linear layer over prompt-sized inputs, per instruction set of the integer
// tile kernels: AVX-512 VNNI against AMX-INT8 (backend/cpu/quant_int8.h), on the same tiles.
// Usage: osprey_quant_gemm_bench [ROUNDS [THREADS]]   (default 7, 1)
// Shapes: a Llama-3.2-1B layer's MLP up (2048 -> 8192) and down (8192 -> 2048) projections;
// weights: MLX 4-bit group 64 (tiles with biases), Q4_0-like symmetric 4-bit group 32 (scales
// only), 8-bit group 64; n rows of x in 16, 64, 256, 512. The arms are interleaved: each round
// times every (weight, shape, n, instruction set) once (enough calls for about 20 ms). Prints
// per arm the median over rounds of microseconds per call, the lowest and highest round, and
// GOPS (2 n in out over the median). The time is the process's CPU time divided by THREADS, so
// that on a shared machine the time spent descheduled is not counted; with THREADS 1 it is the
// kernel's own time. Needs a CPU with AVX-512 VNNI; the AMX rows appear where the CPU and OS
// grant AMX-TILE and AMX-INT8.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "backend/cpu/quant_int8.h"
#include "backend/quant_args.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace {

using namespace osprey;

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Weight {
  std::string name;
  int bits = 4, group = 64, zero = 0;
  int64_t out = 0, in = 0;
  std::vector<uint32_t> packed;
  std::vector<uint16_t> scales, biases;  // f16 bits
  std::vector<uint8_t> tiles;
  QuantArgs args;
};

Weight make_weight(const std::string& name, int bits, int group, int zero, int64_t out, int64_t in, std::mt19937& rng,
                   ThreadPool& pool) {
  Weight w;
  w.name = name;
  w.bits = bits;
  w.group = group;
  w.zero = zero;
  w.out = out;
  w.in = in;
  w.packed.resize(size_t(out * in * bits / 32));
  for (uint32_t& v : w.packed) v = uint32_t(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  const size_t n_groups = size_t(out * in / group);
  for (size_t g = 0; g < n_groups; ++g) {
    const uint16_t s = f32_to_f16(scale(rng));
    w.scales.push_back(s);
    // Symmetric weights: the bias -zero times the scale, exactly (what the scales-only tiles need).
    w.biases.push_back(zero > 0 ? f32_to_f16(-float(zero) * f16_to_f32(s)) : f32_to_f16(-8.0f * scale(rng)));
  }
  QuantArgs& a = w.args;
  a.packed = w.packed.data();
  a.scales = w.scales.data();
  a.biases = w.biases.data();
  a.scale_dtype = DType::f16;
  a.bits = bits;
  a.group_size = group;
  a.out = out;
  a.in = in;
  a.tiles_zero = zero;
  w.tiles.resize(size_t(bits == 8 ? cpu::q8_tiles_bytes(a) : cpu::q4_tiles_bytes(a)));
  if (bits == 8)
    cpu::repack_q8_tiles(a, w.tiles.data(), pool);
  else
    cpu::repack_q4_tiles(a, w.tiles.data(), pool);
  a.tiles = w.tiles.data();
  return w;
}

struct Arm {
  const Weight* w = nullptr;
  int64_t n = 0;
  cpu::Int8Isa isa{};
  int calls = 1;
  std::vector<double> us;
};

void run(const Arm& arm, const std::vector<float>& x, std::vector<float>& y, ThreadPool& pool) {
  if (arm.w->bits == 8)
    cpu::linear_q8_tiles(x.data(), arm.n, arm.w->args, nullptr, y.data(), pool, arm.isa);
  else
    cpu::linear_q4_int8(x.data(), arm.n, arm.w->args, nullptr, y.data(), pool, arm.isa);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  if (rounds < 1 || threads < 1) {
    std::fprintf(stderr, "usage: osprey_quant_gemm_bench [ROUNDS [THREADS]] (both at least 1)\n");
    return 2;
  }
  if (!cpu::int8_isa_supported(cpu::Int8Isa::avx512_vnni)) {
    std::fprintf(stderr, "osprey_quant_gemm_bench: this CPU has no AVX-512 VNNI\n");
    return 1;
  }
  std::vector<cpu::Int8Isa> isas = {cpu::Int8Isa::avx512_vnni};
  if (cpu::int8_isa_supported(cpu::Int8Isa::amx)) isas.push_back(cpu::Int8Isa::amx);
  ThreadPool pool(threads);
  std::mt19937 rng(7);
  std::vector<Weight> weights;
  for (auto [out, in] : {std::pair<int64_t, int64_t>{8192, 2048}, {2048, 8192}}) {
    const std::string shape = std::to_string(in) + "->" + std::to_string(out);
    weights.push_back(make_weight("q4 g64 " + shape, 4, 64, 0, out, in, rng, pool));
    weights.push_back(make_weight("q4_0 (z8 g32) " + shape, 4, 32, 8, out, in, rng, pool));
    weights.push_back(make_weight("q8 g64 " + shape, 8, 64, 0, out, in, rng, pool));
  }
  std::vector<Arm> arms;
  for (const Weight& w : weights)
    for (int64_t n : {16, 64, 256, 512})
      for (cpu::Int8Isa isa : isas) arms.push_back({&w, n, isa, 1, {}});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(512 * 8192)), y(size_t(512 * 8192));
  for (float& v : x) v = normal(rng);
  // Calls per arm for about 20 ms, from one timed call.
  for (Arm& a : arms) {
    run(a, x, y, pool);
    const double t0 = cpu_seconds();
    run(a, x, y, pool);
    const double once = std::max(1e-6, (cpu_seconds() - t0) / threads);
    a.calls = std::max(1, int(0.02 / once));
  }
  for (int r = 0; r < rounds; ++r)
    for (Arm& a : arms) {
      const double t0 = cpu_seconds();
      for (int c = 0; c < a.calls; ++c) run(a, x, y, pool);
      a.us.push_back((cpu_seconds() - t0) / threads / a.calls * 1e6);
    }
  std::printf("| weight | n | isa | us per call (median) | lowest | highest | GOPS |\n| --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
  for (const Arm& a : arms) {
    const double m = median(a.us);
    std::printf("| %s | %lld | %s | %.1f | %.1f | %.1f | %.1f |\n", a.w->name.c_str(), (long long)a.n,
                cpu::int8_isa_name(a.isa), m, *std::min_element(a.us.begin(), a.us.end()),
                *std::max_element(a.us.begin(), a.us.end()), 2.0 * double(a.n * a.w->in * a.w->out) / m * 1e-3);
  }
  return 0;
}
