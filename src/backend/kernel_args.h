#pragma once
// Argument structs shared by the CPU and CUDA kernels (host pointers for src/backend/cpu,
// device pointers for src/backend/cuda). No CUDA headers.
#include <cstdint>

namespace osprey {

// Causal grouped-query attention of n query rows against n_keys cached rows.
struct AttentionArgs {
  const float* q;  // [n, n_heads, head_dim] contiguous
  int64_t n, n_heads, head_dim;
  const uint16_t* k;  // f16 or bf16 bits; key j of head h at k[h * k_head_stride + row(j) * k_row_stride + d]
  const uint16_t* v;  // likewise with v strides; both f16, or both bf16 (bf16 below)
  int64_t n_kv_heads, n_keys;  // n_keys = L keys (indices 0..L-1); keys >= L are never read
  int64_t k_head_stride, k_row_stride, v_head_stride, v_row_stride;  // in elements
  // Index of query row 0 among the keys: row i sits where key q_pos0 + i does. Positions enter
  // only through differences (the causal and window masks), so this is the absolute position
  // minus the position of key 0.
  int64_t q_pos0;
  float scale;     // multiplies q.k
  int window;      // > 0: key j visible to query at position p iff p - window < j <= p; 0: j <= p
  float softcap;   // > 0: logit = softcap * tanh(logit / softcap) (applied after scale)
  float* out;      // [n, n_heads * head_dim] contiguous
  // CUDA, graph-stable positions: when non-null, the query rows' first position is read on the
  // device from *q_pos_dev (so n_keys = *q_pos_dev + n and q_pos0 are ignored on the host
  // side), and the launch shape (grid, split count, shared memory) depends only on n, n_heads,
  // n_kv_heads, head_dim and max_keys, so a graph captured once stays valid while *q_pos_dev
  // changes. The CPU kernel reads neither.
  const int32_t* q_pos_dev = nullptr;
  int64_t max_keys = 0;  // an upper bound of n_keys (the cache capacity); required with q_pos_dev
  // Where key j lives. ring_rows == 0: row j. ring_rows > 0: the keys are a ring of ring_rows
  // rows holding the last ring_rows positions up to the last query's, key j at row
  // (ring_base + j) % ring_rows (ring_base < ring_rows; key 0 is the oldest held position).
  // With q_pos_dev, a CUDA kernel derives the ring's n_keys, ring_base and q_pos0 on the device
  // from the absolute position *q_pos_dev (max_keys == ring_rows), and for a linear view
  // subtracts key_pos0 (the absolute position of key 0) from it.
  int64_t ring_rows = 0, ring_base = 0;
  int64_t key_pos0 = 0;
  bool bf16 = false;  // k and v hold bf16 (else f16)
};

// Writes n rows of K and V (f32 -> f16 or bf16) into cache buffers [n_kv_heads, capacity, head_dim].
// Source element (i, h, d) is at k[i * k_row_stride + h * head_dim + d] (likewise v); it goes to
// kbuf[h * head_stride + row * head_dim + d], row = row0 + i, or (row0 + i) % ring_rows when
// ring_rows > 0; row0 = *pos_dev when pos_dev is set (read on the device, so a captured graph
// writes where the current position says), else pos0.
struct KVWriteArgs {
  uint16_t* kbuf;
  uint16_t* vbuf;
  int64_t head_stride;  // elements between heads of the buffers (capacity * head_dim)
  const float* k;
  const float* v;
  int64_t k_row_stride, v_row_stride;  // elements between source rows
  int64_t n, n_kv_heads, head_dim;
  const int32_t* pos_dev;
  int64_t pos0;
  bool bf16 = false;       // store bf16 (else f16), rounded to nearest even
  int64_t ring_rows = 0;   // > 0: rows wrap modulo ring_rows
};

// A draw of one token from logits (the CUDA sampler, backend/cuda/sample.h).
struct SampleArgs {
  float temperature = 1.0f;  // > 0 and finite
  int top_k = 0;             // 0, or >= the number of non-NaN logits: off
  float top_p = 1.0f;        // in (0, 1]; 1: off
  float min_p = 0.0f;        // in [0, 1); 0: off
  uint64_t seed = 0;         // with the counter, picks the noise (backend/sample_noise.h)
  uint64_t counter = 0;      // the decode step index
  // When set, the counter is read on the device from *counter_dev when the draw runs (a
  // captured graph then draws anew for each value written there) and `counter` is ignored.
  const uint64_t* counter_dev = nullptr;
};

}  // namespace osprey
