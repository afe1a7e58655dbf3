// linear_q_gemv: picks the GEMV kernel (quant_gemv.cuh) and its block shape.
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_gemv.cuh"
#include "backend/cuda/quant_linear.h"

namespace osprey::cuda {
namespace {

// Output rows per block of the fast kernel: 8 (x re-read from L1 once per 8 rows) while that
// still leaves two blocks per SM, else 4 while every SM gets a block, else 1.
int pick_rows(int64_t out, int sms) {
  if ((out + 7) / 8 >= 2 * sms) return 8;
  if ((out + 3) / 4 >= sms) return 4;
  return 1;
}

}  // namespace

void linear_q_gemv(const float* x, int64_t n, const QuantArgs& w, const float* bias, float* y, cudaStream_t s,
                   int rows_per_block) {
  if (n <= 0 || w.out <= 0) return;
  check_quant_args("linear_q", w);
  const bool xv = aligned16(x);  // rows of x stay aligned: in is a multiple of 32
  const bool fast = (w.bits == 4 || w.bits == 8) && xv && aligned16(w.packed);
  const bool bf16 = w.scale_dtype == DType::bf16;
  // The generic kernel's chunks are 32 codes, one group: groups of 16 need the fast kernel's
  // 16-code chunks (8-bit codes, aligned words and x, which the allocator's arrays are).
  if (w.group_size == 16 && !fast)
    throw Unsupported("linear_q: 8-bit codes in groups of 16 need 16-byte aligned words and x");
  qgemv::GemvParams p{};
  p.packed = w.packed;
  p.scales = static_cast<const uint16_t*>(w.scales);
  p.biases = static_cast<const uint16_t*>(w.biases);
  p.bias = bias;
  p.in = w.in;
  p.out = w.out;
  p.group_shift = group_shift(w.group_size);
  p.zero = 0;
  const int rows = rows_per_block == 8 || rows_per_block == 4 || rows_per_block == 1
                       ? rows_per_block
                       : pick_rows(w.out, multiprocessor_count());
  for (int64_t j0 = 0; j0 < n; j0 += kGemvMaxRows) {
    p.n = int(std::min<int64_t>(kGemvMaxRows, n - j0));
    p.x = x + j0 * w.in;
    p.y = y + j0 * w.out;
    if (fast && bf16)
      qgemv::launch_fast<true>(p, w.bits, rows, s);
    else if (fast)
      qgemv::launch_fast<false>(p, w.bits, rows, s);
    else if (bf16)
      qgemv::launch_generic<true>(p, w.bits, xv, s);
    else
      qgemv::launch_generic<false>(p, w.bits, xv, s);
  }
}

}  // namespace osprey::cuda
