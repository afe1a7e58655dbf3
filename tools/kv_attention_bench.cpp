// CPU decode attention time per cached key type (--cache-type-k/-v): one query row against
// DEPTH cached keys, dense (kv/dense_cache.h's layout) and paged (blocks of 16 rows in shuffled
// order), for f16, bf16, q8_0 and fp8 keys and values and q8_0 keys over f16 values.
// Usage: osprey_kv_attention_bench [DEPTH [GROUP [ROUNDS]]]   (default 2048, 1, 15)
// Shape: 8 kv heads of 128, GROUP query heads each, four layers' buffers read in turn (as a
// 4-layer model's step reads them). Threads: OSPREY_THREADS (default: the pool's), level:
// OSPREY_CPU_LEVEL. The arms are interleaved: each round times every arm once (20 calls each);
// prints, per arm, the median over rounds of microseconds per call, the lowest and highest round,
// and the cached bytes one call reads over the median time. The time is the process's CPU time
// (CLOCK_PROCESS_CPUTIME_ID), so that on a shared machine the time spent descheduled is not
// counted; with one thread (OSPREY_THREADS=1) it is the kernel's own time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "backend/ops.h"
#include "core/array.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"

namespace {

using namespace osprey;
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

constexpr int64_t kKvHeads = 8, kHeadDim = 128, kLayers = 4, kBlock = 16, kCalls = 20;

Array random_rows(int64_t n, int64_t heads, std::mt19937& rng) {
  std::normal_distribution<float> u(0.0f, 1.0f);
  Array a = Array::empty({n, heads, kHeadDim}, DType::f32);
  for (int64_t i = 0; i < n * heads * kHeadDim; ++i) a.data<float>()[i] = u(rng);
  return a;
}

struct Arm {
  std::string name;
  DType kt, vt;
  bool paged;
  std::vector<Array> k, v;  // per layer
  Array tables, lens;       // paged
  std::vector<double> us;   // per round: microseconds per call
  double bytes = 0;         // cached bytes one call reads
};

void fill(Arm& arm, int64_t depth, std::mt19937& rng) {
  const int64_t n_blocks = (depth + kBlock - 1) / kBlock;
  if (arm.paged) {
    std::vector<int32_t> order(static_cast<size_t>(n_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    arm.tables = Array::empty({1, n_blocks}, DType::i32);
    std::copy(order.begin(), order.end(), arm.tables.data<int32_t>());
    arm.lens = Array::empty({1}, DType::i32);
    arm.lens.data<int32_t>()[0] = int32_t(depth);
  }
  for (int64_t l = 0; l < kLayers; ++l) {
    const Array kr = random_rows(depth, kKvHeads, rng), vr = random_rows(depth, kKvHeads, rng);
    if (arm.paged) {
      Array k = Array::zeros({n_blocks, kKvHeads, kBlock, packed_row_width(arm.kt, kHeadDim)}, arm.kt);
      Array v = Array::zeros({n_blocks, kKvHeads, kBlock, packed_row_width(arm.vt, kHeadDim)}, arm.vt);
      Array slots = Array::empty({depth}, DType::i32);
      for (int64_t j = 0; j < depth; ++j)
        slots.data<int32_t>()[j] = arm.tables.data<int32_t>()[j / kBlock] * int32_t(kBlock) + int32_t(j % kBlock);
      ops::write_kv_paged(k, v, kr, vr, slots);
      arm.k.push_back(k);
      arm.v.push_back(v);
    } else {
      Array k = Array::zeros({kKvHeads, depth, packed_row_width(arm.kt, kHeadDim)}, arm.kt);
      Array v = Array::zeros({kKvHeads, depth, packed_row_width(arm.vt, kHeadDim)}, arm.vt);
      ops::write_kv_rows(k, v, kr, vr, 0);
      arm.k.push_back(k);
      arm.v.push_back(v);
    }
  }
  arm.bytes = double(depth * kKvHeads) *
              double(packed_row_width(arm.kt, kHeadDim) * dtype_size(arm.kt) +
                     packed_row_width(arm.vt, kHeadDim) * dtype_size(arm.vt));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t depth = argc > 1 ? std::max(1, std::atoi(argv[1])) : 2048;
  const int64_t group = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 15;
  if (const char* t = std::getenv("OSPREY_THREADS")) set_cpu_threads(std::atoi(t));
  const std::pair<DType, DType> types[] = {{DType::f16, DType::f16},
                                           {DType::bf16, DType::bf16},
                                           {DType::q8_0, DType::q8_0},
                                           {DType::fp8_e4m3, DType::fp8_e4m3},
                                           {DType::q8_0, DType::f16}};
  std::mt19937 rng(7);
  std::vector<Arm> arms;
  for (bool paged : {false, true})
    for (auto [kt, vt] : types) {
      Arm arm{std::string(paged ? "paged " : "dense ") + dtype_name(kt) + "/" + dtype_name(vt), kt, vt, paged, {}, {},
              {}, {}, {}, 0};
      fill(arm, depth, rng);
      arms.push_back(std::move(arm));
    }
  const Array q = random_rows(1, kKvHeads * group, rng);
  ops::AttentionParams p;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  p.q_pos0 = depth - 1;
  float sink = 0.0f;
  for (int r = 0; r <= rounds; ++r)  // round 0 warms up
    for (Arm& arm : arms) {
      if (arm.paged)
        p.keys = ops::PagedKeys{arm.tables, arm.lens, 0};
      else
        p.keys = ops::LinearKeys{0};
      const double t0 = cpu_seconds();
      for (int64_t c = 0; c < kCalls; ++c) {
        const int64_t l = c % kLayers;
        sink += ops::attention(q, arm.k[size_t(l)], arm.v[size_t(l)], p).data<float>()[0];
      }
      const double us = (cpu_seconds() - t0) * 1e6 / double(kCalls);
      if (r > 0) arm.us.push_back(us);
    }
  std::printf("depth %lld, %lld kv heads of %lld, %lld query heads each, %d rounds of %lld calls (sink %g)\n",
              static_cast<long long>(depth), static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim),
              static_cast<long long>(group), rounds, static_cast<long long>(kCalls), double(sink));
  std::printf("| arm | median us/call | lowest | highest | GB/s at the median |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: |\n");
  for (Arm& arm : arms) {
    std::vector<double> s = arm.us;
    std::sort(s.begin(), s.end());
    const double med = s[s.size() / 2];
    std::printf("| %s | %.1f | %.1f | %.1f | %.2f |\n", arm.name.c_str(), med, s.front(), s.back(),
                arm.bytes / med / 1e3);
  }
  return 0;
}
