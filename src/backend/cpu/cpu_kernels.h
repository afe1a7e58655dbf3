#pragma once
// CPU compute kernels for linear layers and attention. Callers (src/backend/ops.cpp) check
// shapes and dtypes; these functions trust their arguments. All kernels run on `pool` and
// block until done; none may be called from inside a task of the same pool. Scratch memory is
// thread_local and grows once (the GEMM's packed copy of x is at most 16 MiB); the decode
// paths (n == 1) allocate nothing.
#include <cstdint>

#include "backend/cpu/level.h"
#include "backend/kernel_args.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace osprey::cpu {
OSPREY_CPU_LEVEL_BEGIN

// y[n, out] = x[n, in] * w[out, in]^T + bias[out] (bias may be nullptr). x, y, bias f32,
// row-major, contiguous; w is f32, f16 or bf16, row-major contiguous. Accumulates in f32.
// n <= 16 runs linear_rows (w streamed once, at memory bandwidth); larger n runs linear_gemm.
// Throws Unsupported for another w dtype.
void linear(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
            const float* bias, float* y, ThreadPool& pool);

// The two paths behind linear(), with its contract; exposed so that tests and benchmarks can
// pin one.
// Dot-product kernel: rows of w split across threads, each row read once for all n rows of x.
void linear_rows(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
                 const float* bias, float* y, ThreadPool& pool);
// Blocked GEMM: tiles of w converted to f32 and packed once, register-blocked micro-kernel.
void linear_gemm(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
                 const float* bias, float* y, ThreadPool& pool);

// linear() in batch-invariant mode (ops::set_batch_invariant): row j of y is bit for bit what
// linear(x + j * in, 1, ...) gives, for any n (each row takes the n == 1 matvec's accumulators
// and reduction order; w is still streamed once per tile of rows for all rows of x).
void linear_invariant(const float* x, int64_t n, int64_t in, const void* w, DType w_dtype, int64_t out,
                      const float* bias, float* y, ThreadPool& pool);

using osprey::AttentionArgs;  // backend/kernel_args.h

// Causal grouped-query attention: query head h reads kv head h / (n_heads / n_kv_heads).
// Softmax in f32 with a running max (online softmax over blocks of keys). A query row that
// sees no key gets zeros. Parallel over (kv head x block of query rows), and over ranges of
// keys when that alone leaves threads idle (decode).
void attention(const AttentionArgs& a, ThreadPool& pool);

using osprey::PagedAttentionArgs;  // backend/kernel_args.h

// Paged decode attention (PagedAttentionArgs): parallel over (sequence, kv head, split of
// kPagedSplitKeys keys), each kv head's group of query heads served by one pass over its keys;
// the splits of a sequence merge in ascending order, so a sequence's output is the same bit
// for bit whatever the rest of the batch and the thread count. A sequence of length 0 gets
// zeros. The caller has checked the block ids and lengths.
void paged_attention(const PagedAttentionArgs& a, ThreadPool& pool);

OSPREY_CPU_LEVEL_END
}  // namespace osprey::cpu
