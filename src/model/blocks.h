#pragma once
// Blocks that families build their layers from. Each takes its weights as loaded
// (model/linear_group.h), in whichever form the loader chose, and gives the same result.
#include <cstdint>

#include "core/array.h"
#include "model/linear_group.h"

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

// h [n, hidden] f32 through the q, k and v projections `qkv` (three parts, in that order), with
// rotary embeddings applied to q and k at `positions` (i32 [n]) with `inv_freq`
// (f32 [head_dim / 2]; see ops::rope_ for `interleaved`).
AttentionInputs attention_inputs(const Array& h, const LinearGroup& qkv, const AttentionShape& shape,
                                 const Array& positions, const Array& inv_freq, bool interleaved = false);

// silu(h W_gate + b_gate) * (h W_up + b_up): h [n, hidden] f32 through `gate_up` (two parts,
// gate then up) -> [n, f] f32.
Array silu_gate(const Array& h, const LinearGroup& gate_up);

}  // namespace osprey
