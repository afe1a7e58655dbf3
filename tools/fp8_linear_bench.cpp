// Time of one linear layer on CUDA per path, for Llama-3.1-8B's four layer shapes and rows of x
// from 1 to 512: bf16 weights (cuda::linear: GEMV up to 8 rows, cuBLAS above), and FP8 e4m3
// weights with one scale per row through the GEMV (up to 32 rows), the W8A8 tensor-core GEMM
// (cuBLASLt, scales applied by cuBLASLt or after the product) and the dequantize-then-cuBLAS
// path (backend/cuda/fp8_linear.h). Median of 20 timed calls (CUDA events) after 3 warmups;
// random weights and x. Prints a markdown table of microseconds per call.
// Usage: osprey_fp8_linear_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/fp8_linear.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"

namespace {

using namespace osprey;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  check(cudaMalloc(&d, v.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

double median_us(const std::function<void()>& f) {
  cudaStream_t s = cuda::stream();
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  std::vector<double> t;
  for (int i = 0; i < 20; ++i) {
    check(cudaEventRecord(a, s), "record");
    f();
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms * 1000.0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  const int64_t rows[] = {1, 2, 4, 8, 16, 32, 64, 512};
  std::mt19937 rng(1);
  std::printf("| layer | rows | bf16 us | FP8 GEMV us | FP8 W8A8 us | FP8 W8A8 (scales after) us | FP8 dequant + cuBLAS us |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Shape& sh : shapes) {
    std::vector<uint8_t> codes(size_t(sh.out * sh.in));
    for (auto& c : codes) {
      do c = uint8_t(rng()); while ((c & 0x7f) >= 0x78);  // finite codes up to 2^7
    }
    std::vector<float> scales(size_t(sh.out), 1e-3f);
    std::vector<uint16_t> wbf(codes.size());
    std::uniform_int_distribution<int> bits(0x3c00, 0x3d00);
    for (auto& w : wbf) w = uint16_t(bits(rng) ^ (rng() & 0x8000));
    const int64_t max_n = 512;
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t(max_n * sh.in));
    for (auto& v : x) v = nd(rng);
    uint8_t* dcodes = upload(codes);
    float* dscales = upload(scales);
    uint16_t* dw = upload(wbf);
    float* dx = upload(x);
    float* dy = nullptr;
    check(cudaMalloc(&dy, size_t(max_n * sh.out) * sizeof(float)), "cudaMalloc");
    Fp8Args a;
    a.codes = dcodes;
    a.scales = dscales;
    a.out = sh.out;
    a.in = sh.in;
    a.n_groups = 1;
    cudaStream_t s = cuda::stream();
    for (int64_t n : rows) {
      const double t16 = median_us([&] { cuda::linear(dx, n, sh.in, dw, DType::bf16, sh.out, nullptr, dy, s); });
      const double tgv = n <= cuda::kFp8GemvMaxRows
                             ? median_us([&] { cuda::linear_fp8_gemv(dx, n, a, nullptr, dy, s); })
                             : -1.0;
      const double tmma = median_us([&] { cuda::linear_fp8_mma(dx, n, a, nullptr, dy, s, true); });
      const double tmma2 = median_us([&] { cuda::linear_fp8_mma(dx, n, a, nullptr, dy, s, false); });
      const double tdq = median_us([&] { cuda::linear_fp8_gemm(dx, n, a, nullptr, dy, s); });
      char gv[32];
      if (tgv < 0)
        std::snprintf(gv, sizeof gv, "-");
      else
        std::snprintf(gv, sizeof gv, "%.1f", tgv);
      std::printf("| %s [%lld, %lld] | %lld | %.1f | %s | %.1f | %.1f | %.1f |\n", sh.name, (long long)sh.out,
                  (long long)sh.in, (long long)n, t16, gv, tmma, tmma2, tdq);
      std::fflush(stdout);
    }
    cudaFree(dcodes);
    cudaFree(dscales);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
  }
  return 0;
}
