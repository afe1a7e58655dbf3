#pragma once
// The op interface that model families are written against. Each op checks its arguments
// and dispatches on the arrays' device to a CPU (src/backend/cpu) or CUDA kernel; no family
// file knows the device. Activations are float32 on the CPU; weights may be f32, f16 or bf16.
// Ops return new arrays (new identities); ops ending in `_` write into an argument.
#include <cstdint>
#include <span>
#include <variant>

#include "backend/kernel_args.h"
#include "core/array.h"

namespace osprey::ops {

// Throws InvalidInput naming the first id outside [0, vocab) ("<what> 7 is outside the
// vocabulary [0, 4)").
void check_token_ids(std::span<const int32_t> ids, int64_t vocab, const char* what = "token id");

// table [vocab, d] (f32|f16|bf16), ids [n] i32 -> [n, d] f32, each row times `scale`.
// Throws InvalidInput for an id outside [0, vocab).
Array embedding(const Array& table, const Array& ids, float scale = 1.0f);

// x [n, d] f32, weight [d] -> [n, d] f32: x / rms(x) * (unit_offset ? 1 + w : w).
Array rms_norm(const Array& x, const Array& weight, float eps, bool unit_offset = false);

// x [n, d] f32, weight [d], bias [d] or undefined -> [n, d] f32 (mean-centred LayerNorm).
Array layer_norm(const Array& x, const Array& weight, const Array& bias, float eps);

// x [n, in] f32, w [out, in] (f32|f16|bf16), bias [out] or undefined -> [n, out] f32.
// n == 1 runs a multi-threaded SIMD matvec; larger n a blocked GEMM (every n the matvec's
// arithmetic in batch-invariant mode, set_batch_invariant). Accumulates in f32.
Array linear(const Array& x, const Array& w, const Array& bias = {});

// x += y, both f32 of equal shape.
void add_(Array& x, const Array& y);
// x *= s
void scale_(Array& x, float s);

// x += y, then returns rms_norm(x, weight, eps, unit_offset): the residual add fused with
// the norm that follows it. x, y f32 contiguous of equal shape.
Array add_rms_norm(Array& x, const Array& y, const Array& weight, float eps, bool unit_offset = false);

// gu [n, 2f] f32 (a fused gate/up projection) -> silu(gu[:, :f]) * gu[:, f:], [n, f].
Array silu_mul_split(const Array& gu);

// gu [n, 2f] f32 (a fused gate/up projection) -> gelu_tanh(gu[:, :f]) * gu[:, f:], [n, f]
// (GeGLU with the tanh approximation of GELU).
Array gelu_tanh_mul_split(const Array& gu);

// x [n, heads, head_dim] f32 (rows may be strided, heads contiguous: e.g. the q or the k heads
// of a fused q/k/v row), each head normalised in place: x / rms(x) * (unit_offset ? 1 + w : w)
// with weight [head_dim] f32 (per-head q/k RMSNorm).
void head_rms_norm_(Array& x, const Array& weight, float eps, bool unit_offset = false);

// x = cap * tanh(x / cap) element-wise, in place (final-logit softcapping); x f32 contiguous,
// cap > 0.
void softcap_(Array& x, float cap);

// Fixed scales of fp8 K/V rows (a checkpoint's k_scale / v_scale: KVCacheParams::k_scales,
// v_scales). A side's span empty: each row takes its own scale, max|x| / 448 (kv_quant.h); else
// one per kv head, or one for every head (each finite and > 0), and a row is stored as that
// scale then the e4m3 codes of x / scale (saturating at 448). Non-empty only for fp8_e4m3
// buffers (InvalidInput otherwise). The spans are read during the call only.
struct KVRowScales {
  std::span<const float> k, v;
};

// Writes k, v [n, n_kv_heads, head_dim] f32 (rows may be strided, heads contiguous), rounded
// to nearest even in the buffers' type, into rows row0 .. row0 + n - 1 of keys, values
// [n_kv_heads, capacity, packed_row_width(type, head_dim)] (contiguous buffers, each f16, bf16,
// or on the CPU a packed row format: q8_0 blocks or fp8_e4m3 rows, quantized here from the f32
// row, so a row's bytes depend on that row alone). ring_rows > 0 (==
// capacity): row0 is a position and row p goes to p % ring_rows (n <= ring_rows; the run may
// wrap). When `positions` (i32 [n], on the arrays' device) is defined, a CUDA kernel takes row0
// from positions[0] on the device instead, so a captured graph writes at the current position;
// the caller guarantees positions[0] == row0.
// `scales`: KVRowScales (fp8 buffers only).
void write_kv_rows(const Array& keys, const Array& values, const Array& k, const Array& v, int64_t row0,
                   const Array& positions = {}, int64_t ring_rows = 0, const KVRowScales& scales = {});

// gate, up [n, f] f32 -> silu(gate) * up
Array silu_mul(const Array& gate, const Array& up);
// gate, up [n, f] f32 -> gelu_tanh(gate) * up
Array gelu_tanh_mul(const Array& gate, const Array& up);

// x [n, n_heads, head_dim] f32 (rows may be strided: e.g. the q and k heads of a fused q/k/v
// row), rotated in place. positions [n] i32, inv_freq [head_dim/2]
// f32 (already scaled, e.g. llama3). `interleaved`: rotate pairs (2i, 2i+1) instead of
// (i, i + head_dim/2). cos and sin are multiplied by `mscale`.
void rope_(Array& x, const Array& positions, const Array& inv_freq, bool interleaved, float mscale = 1.0f);

// Where attention's keys sit: one of three layouts, as a type, so that a kernel is never handed
// a mix.
//
// k, v [n_kv_heads, L, head_dim], row j holding position key_pos0 + j (key_pos0 > 0 when a
// bounded cache hands over only its recent rows; then window > 0 and q_pos0 - window + 1 >=
// key_pos0, so that every key a query sees is there).
struct LinearKeys {
  int64_t key_pos0 = 0;
};
// k, v a ring of `rows` rows holding the last `rows` positions, position p at row p % rows (a
// rotating cache's buffers), the newest being the last query's. Needs window > 0, window + n - 1
// <= rows and k.dim(1) == rows.
struct RingKeys {
  int64_t rows = 0;
};
// A paged pool (kv/paged_pool.h) for a batch of sequences decoding one token each: k and v are
// the pool's [n_blocks, n_kv_heads, block_size, head_dim] arrays (f16 or bf16), q holds one
// query row per sequence (n sequences; rows may be strided, heads contiguous), and
//   block_tables i32 [n, max_blocks] on q's device: sequence i's key position j sits at row
//     j % block_size of block block_tables[i, j / block_size];
//   seq_lens i32 [n] on q's device: sequence i has seq_lens[i] >= 1 keys (positions
//     0 .. seq_lens[i] - 1, the last one just written), and its query sits at position
//     seq_lens[i] - 1 (window applies; q_pos0 and positions are unused). A length of 0 (a
//     padded batch entry) gives a row of zeros.
// The CPU checks lengths (<= max_blocks * block_size) and the block ids they use, and throws
// InvalidInput; a CUDA kernel cannot (they stay on the device): it clamps lengths to the table
// and reads zeros for an id outside the pool. CUDA takes head_dim 32, 64, 128 or 256. The
// launch shape depends on n and max_blocks only (a captured graph stays valid while the lengths
// grow), and each sequence's result is the same bit for bit whatever the other rows of the
// batch are (the reduction over keys is split at fixed key positions).
struct PagedKeys {
  Array block_tables;
  Array seq_lens;
  // Keys per split (0: the default, 512): a positive multiple of 64. The result of a sequence
  // depends on it; keep it fixed for batch invariance. Smaller splits spread a few short
  // sequences over more of the device.
  int64_t split_keys = 0;
};
using KeyLayout = std::variant<LinearKeys, RingKeys, PagedKeys>;

// Causal grouped-query attention of n query rows against the cached keys.
//   q [n, n_heads, head_dim] f32; k, v both f16 or both bf16 (strided views allowed) laid out as
//   `keys` says; on the CPU each of k and v may also be another of f16, bf16, q8_0 and fp8_e4m3
//   (packed rows [.., packed_row_width(type, head_dim)], decoded as read: backend/cpu/kv_rows.h);
//   query row i sits at absolute position q_pos0 + i and sees the key at position j iff
//   j <= q_pos0 + i and, when window > 0, j > q_pos0 + i - window. Returns
//   [n, n_heads * head_dim] f32. Errors name a violation of the layout's conditions.
struct AttentionParams {
  int64_t q_pos0 = 0;
  float scale = 1.0f;
  int window = 0;
  float softcap = 0.0f;  // 0: none; else logits = softcap * tanh(logits / softcap)
  // Graph-stable form: when `positions` (i32 [n] on q's device, positions[0] == q_pos0) is
  // defined, a CUDA kernel reads the first query position from it on the device, and its launch
  // shape depends only on `max_keys` (>= k.dim(1); the cache capacity), not on the current
  // length. The CPU runs eagerly and reads q_pos0.
  Array positions;
  int64_t max_keys = 0;
  KeyLayout keys;
};
Array attention(const Array& q, const Array& k, const Array& v, const AttentionParams& p);

// Unmasked grouped-query attention (a vision encoder's): every query row sees all L keys.
//   q [n, n_heads, head_dim] f32 contiguous; k, v [n_kv_heads, L, head_dim] both f16 or both
//   bf16 (strided views allowed, rows contiguous); returns [n, n_heads * head_dim] f32. Each
//   query row is one attention() call at the last key's position (the causal bound then covers
//   every key).
Array attention_unmasked(const Array& q, const Array& k, const Array& v, float scale);

// Paged KV rows: k, v [n, n_kv_heads, head_dim] f32 (rows may be strided, heads contiguous),
// rounded to nearest even in the pool's type, written into the pool's keys, values
// [n_blocks, n_kv_heads, block_size, packed_row_width(type, head_dim)] (f16 or bf16, on the
// CPU also q8_0 or fp8_e4m3, keys and values each their own; contiguous): row i goes to block
// slots[i] / block_size, row slots[i] % block_size. slots i32 [n] on the pool's device; a slot
// below 0 skips its row (a padded batch entry). A slot past the pool throws InvalidInput on the
// CPU and writes nothing on CUDA (read on the device).
// `scales`: KVRowScales (fp8 pools only).
void write_kv_paged(const Array& keys, const Array& values, const Array& k, const Array& v, const Array& slots,
                    const KVRowScales& scales = {});

// The rows of one sequence from a paged pool, made contiguous: pool [n_blocks, n_kv_heads,
// block_size, head_dim] (f16 or bf16), block_ids i32 [>= ceil(n_rows / block_size)] on the
// pool's device -> [n_kv_heads, n_rows, head_dim] in the pool's type, row j from block
// block_ids[j / block_size], row j % block_size. An id outside the pool throws InvalidInput on
// the CPU and gives zero rows on CUDA (one kernel, ids read on the device).
Array gather_kv_blocks(const Array& pool, const Array& block_ids, int64_t n_rows);

// Batch invariance (process-wide, off by default): while on, every op that works row by row
// (linear layers dense or quantized, norms, activations, rotary embedding, embedding) computes
// each row of its output bit for bit as it would for that row alone (n == 1), whatever the
// number of rows and their neighbours; the paged attention is so always. Costs speed.
void set_batch_invariant(bool on);
bool batch_invariant();

// Greedy token choice for each row on the device: logits [n, vocab] f32 -> out i32 [n] (the
// lowest id on ties); a row with a NaN or an infinity sets nonfinite[i] to 1 (else 0), i32 [n].
// Both outputs on the logits' device. `allowed`, when defined, is a token mask per row, u32
// [n, words] on the same device (bit id % 32 of word id / 32, the little-endian reading of
// grammar::Matcher's u64 masks; ids past words * 32 are not allowed): only allowed ids are
// chosen, and out[i] is -1 when row i allows none (constrained greedy decoding).
void argmax_rows(const Array& logits, Array& out, Array& nonfinite, const Array& allowed = {});

// Every element of a (i32, contiguous) set to `value`. On CUDA the value travels with the
// launch, so the host may change it for the next call at once.
void fill_i32_(Array& a, int32_t value);

// Token choice on the device (pipelined decode): from the last row of logits [.., vocab] f32
// on a CUDA device into out [1] i32 on the same device. temperature <= 0: argmax (the lowest
// id on ties); else a draw from softmax(logits / temperature) cut by top_k, top_p and min_p,
// its noise fixed by (seed, counter).
struct DeviceSampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
};
void sample_into(const Array& logits, const DeviceSampling& p, uint64_t counter, Array& out);

// Token choice for every row of logits [n, vocab] f32 on a CUDA device, each row with its
// own parameters (sample/sampler.h's chain; `rows` [n], `adjust` the rows' logit changes, each
// row's [adjust_begin, adjust_end) of it): out i32 [n] gets the tokens (-1: nothing left to
// choose), nonfinite i32 [n] 1 where a row held a NaN or an Inf; both on the logits' device.
// `allowed`: as argmax_rows'. The adjusted rows of `logits` are changed in place. The
// parameters are copied to the device (the spans may be reused at once).
void sample_rows(Array& logits, std::span<const SampleRowArgs> rows, std::span<const LogitAdjust> adjust, Array& out,
                 Array& nonfinite, const Array& allowed = {});

// Element-wise cast-copy between arrays of equal shape (any strides, f32/f16/bf16/i32).
void copy_into(const Array& dst, const Array& src);
// A contiguous copy in `dtype`.
Array cast(const Array& src, DType dtype);

// `src` on `device` (itself when already there). A copy to the CPU waits for the device's
// stream; a copy to a CUDA device is queued on it (the source may be reused at once).
Array to_device(const Array& src, Device device);
// `src` on the host (itself when already there); a copy from a device waits for its stream.
// For code that decides on the host from values computed on the device (a router's choice).
Array to_host(const Array& src);
// Waits for the device's queued work (no-op on the CPU).
void synchronize(Device device);

// What a device's kernels prefer, for the choices made once while weights load.
struct DeviceTraits {
  // Linear layers that read one input (q/k/v, gate/up) run faster as one weight with their
  // rows stacked. Off on the CPU, whose weights stay zero-copy views of the memory map.
  bool stack_shared_input_linears = false;
};
DeviceTraits device_traits(Device device);

// Returns the device memory that its allocator caches but nothing holds to the system (at
// the end of loading: the parts of stacked weights). Nothing to do on the CPU.
void release_cached_memory(Device device);

}  // namespace osprey::ops
