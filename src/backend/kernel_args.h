#pragma once
// Argument structs shared by the CPU and CUDA kernels (host pointers for src/backend/cpu,
// device pointers for src/backend/cuda). No CUDA headers.
#include <cstdint>

namespace osprey {

// The element format of cached K or V rows as the CPU kernels read them: f16 or bf16 elements,
// or packed rows of bytes (core/dtype.h: q8_0 blocks, fp8_e4m3 with a float32 scale per row).
enum class KVElem : uint8_t { f16, bf16, q8_0, fp8_e4m3 };

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
  // The CPU kernel's formats of k and v, each its own (CUDA reads `bf16` alone: both 16-bit,
  // one type). With `bf16` set, a side left at f16 reads bf16, so a caller that sets `bf16` only
  // means both. For a packed format the pointer is the rows' byte address and its strides count
  // bytes.
  KVElem k_elem = KVElem::f16, v_elem = KVElem::f16;
  // ops::batch_invariant(): each query row's result must not depend on the other rows or on
  // where its chunk starts, so the kernels neither split the keys by the work at hand nor
  // change their arithmetic with the number of rows.
  bool batch_invariant = false;
};

// Keys per split of the paged attention by default, on every device. The reduction over a
// sequence's keys is cut at multiples of the split size (never at a point derived from the
// batch or the device), and the splits' partial results are merged in order, so that a
// sequence's output does not depend on the other rows of the batch as long as the caller keeps
// the split size (AttentionParams::paged_split_keys) fixed.
constexpr int64_t kPagedSplitKeys = 512;

// Paged decode attention: one query row per sequence against that sequence's keys in a paged
// pool. Sequence i has len = seq_lens[i] keys (positions 0 .. len - 1); its query sits at
// position len - 1 and sees key j iff j <= len - 1 and, when window > 0, j > len - 1 - window.
// Key j of sequence i, kv head h, is row j % block_size of block b = block_tables[i *
// max_blocks + j / block_size]: k[((b * n_kv_heads + h) * block_size + j % block_size) *
// head_dim + d] (likewise v). A CUDA kernel reads block_tables and seq_lens on the device; its
// launch shape depends on n, n_heads, n_kv_heads, head_dim, max_blocks and block_size only.
struct PagedAttentionArgs {
  const float* q;         // [n, n_heads, head_dim], row i at q + i * q_row_stride (heads contiguous)
  int64_t q_row_stride;   // elements between query rows (>= n_heads * head_dim)
  int64_t n, n_heads, head_dim;
  const uint16_t* k;      // [n_blocks, n_kv_heads, block_size, head_dim] f16 or bf16 bits, contiguous
  const uint16_t* v;      // likewise
  int64_t n_blocks, n_kv_heads, block_size;
  const int32_t* block_tables;  // [n, max_blocks]
  const int32_t* seq_lens;      // [n]
  int64_t max_blocks;
  float scale;     // multiplies q.k
  int window;      // > 0: sliding window
  float softcap;   // > 0: logit = softcap * tanh(logit / softcap) (applied after scale)
  float* out;      // [n, n_heads * head_dim] contiguous
  bool bf16 = false;  // the pool holds bf16 (else f16)
  // The CPU kernel's formats of the keys and values pools, each its own (CUDA reads `bf16`
  // alone; with it set, a side left at f16 reads bf16, as above). For a packed format the pointer is the pool's byte address and a row is
  // packed_row_width(format, head_dim) bytes instead of head_dim elements.
  KVElem k_elem = KVElem::f16, v_elem = KVElem::f16;
  // Keys per split: split s covers key positions [s * split_keys, (s + 1) * split_keys). A
  // positive multiple of 64 (kPagedSplitKeys by default).
  int64_t split_keys = kPagedSplitKeys;
};

// Paged K/V rows: row i of k, v (k[i * k_row_stride + h * head_dim + d], f32) goes, rounded to
// nearest even, to pool row slot = slots[i] (block slot / block_size, row slot % block_size):
// kpool[((slot / block_size * n_kv_heads + h) * block_size + slot % block_size) * head_dim + d].
// A slot below 0 skips the row. slots are read on the device by a CUDA kernel.
struct PagedKVWriteArgs {
  uint16_t* kpool;
  uint16_t* vpool;
  int64_t n_blocks, n_kv_heads, block_size, head_dim;
  const float* k;
  const float* v;
  int64_t k_row_stride, v_row_stride;  // elements between source rows
  const int32_t* slots;                // [n]
  int64_t n;
  bool bf16 = false;  // store bf16 (else f16)
};

// One sequence's rows from a paged pool, made contiguous: out [n_kv_heads, n_rows, head_dim]
// (the pool's type), row j of head h from block block_ids[j / block_size], row j % block_size.
// A CUDA kernel reads block_ids on the device and writes zeros for an id outside the pool.
struct PagedGatherArgs {
  const uint16_t* pool;  // [n_blocks, n_kv_heads, block_size, head_dim]
  int64_t n_blocks, n_kv_heads, block_size, head_dim;
  const int32_t* block_ids;  // [>= ceil(n_rows / block_size)]
  int64_t n_rows;
  uint16_t* out;
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

// One row of a batched token choice (the CUDA sampler's sample_rows, backend/cuda/sample.h):
// the chain of sample/sampler.h with this row's parameters.
struct SampleRowArgs {
  float temperature = 0.0f;  // <= 0: greedy (argmax, the lowest id on ties)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1); 0: off
  float typical_p = 1.0f;    // (0, 1]; 1: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  uint64_t counter = 0;      // the draw's index in its sequence (sample_noise.h's counter)
  int32_t adjust_begin = 0;  // the row's entries of the LogitAdjust list: [begin, end)
  int32_t adjust_end = 0;
};

// The cuts sample_rows runs passes for (a bitmask): a row's cut runs only when its bit is set.
constexpr int kSampleCutTopK = 1;
constexpr int kSampleCutTopP = 2;
constexpr int kSampleCutTypical = 4;

// A change to one logit of a row before the cuts: the logit bias added (or the token banned:
// -inf), then the penalties of a token seen `count` times in the penalty window. A row's
// entries have distinct ids, in ascending order.
struct LogitAdjust {
  int32_t id = 0;
  int32_t count = 0;  // 0: no penalty
  float bias = 0.0f;
  int32_t banned = 0;
};

}  // namespace osprey
