#pragma once
// Blocks that families build their layers from. Each takes its weights as loaded
// (model/linear_group.h), in whichever form the loader chose, and gives the same result.
#include <cstdint>
#include <memory>
#include <string>

#include "core/array.h"
#include "backend/communicator.h"
#include "kv/kv_cache.h"
#include "model/linear_group.h"
#include "model/model.h"

namespace osprey {

// The query, key and value heads of one attention layer.
struct AttentionInputs {
  Array q;  // [n, n_heads, head_dim] f32, contiguous
  Array k;  // [n, n_kv_heads, head_dim] f32 (rows may be strided, heads contiguous)
  Array v;  // [n, n_kv_heads, head_dim] f32 (the same)
};

struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// The attention heads one tensor-parallel rank computes: query heads [q_head0, q_head0 +
// n_heads) whole, and the K/V heads they read, [kv_head0, kv_head0 + n_kv_heads). With fewer
// K/V heads than ranks each K/V head is replicated on the ranks whose query heads use it.
struct HeadShard {
  int64_t q_head0 = 0, n_heads = 0;
  int64_t kv_head0 = 0, n_kv_heads = 0;
};
// Throws InvalidInput naming the numbers when the ranks do not divide the query heads, or
// neither divide nor are divided by the K/V heads. `shard.size == 1`: every head.
HeadShard shard_heads(int64_t n_heads, int64_t n_kv_heads, const ShardSpec& shard);

// What happens to the q and k heads between the projection and attention, in this order.
struct QKTransform {
  // Per-head RMSNorm (ops::head_rms_norm_): weights [head_dim] f32, both or neither defined.
  Array q_norm, k_norm;
  float norm_eps = 1e-6f;
  bool norm_unit_offset = false;
  // Rotary embeddings at the step's positions (ops::rope_); undefined: none (a layer without
  // position encoding).
  Array inv_freq;  // [head_dim / 2] f32
  bool interleaved = false;
};

// h [n, hidden] f32 through the q, k and v projections `qkv` (three parts, in that order), with
// q and k transformed as `t` says at `positions` (i32 [n]).
AttentionInputs attention_inputs(const Array& h, const LinearGroup& qkv, const AttentionShape& shape,
                                 const Array& positions, const QKTransform& t);
// The element type of cached K/V rows (KVCacheParams::dtype) for a checkpoint whose weights
// are `weight_dtype`, for families whose activations may pass float16's range: bf16 for a
// bf16 checkpoint, f16 otherwise.
DType kv_rows_dtype(DType weight_dtype);

// A layer's cache parameters (layer_cache_params): `params` with the family's K/V geometry,
// row type and window (0 for a full-attention layer) filled in.
KVCacheParams layer_kv_params(KVCacheParams params, int64_t n_kv_heads, int64_t head_dim, DType rows,
                              int64_t window);

// silu(h W_gate + b_gate) * (h W_up + b_up): h [n, hidden] f32 through `gate_up` (two parts,
// gate then up) -> [n, f] f32.
Array silu_gate(const Array& h, const LinearGroup& gate_up);

// gelu_tanh(h W_gate + b_gate) * (h W_up + b_up) (GeGLU), as silu_gate.
Array gelu_gate(const Array& h, const LinearGroup& gate_up);

}  // namespace osprey
