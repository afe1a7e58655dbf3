#pragma once
// The batched backend of the scheduler (docs/design.md, "Batched serving"): every running
// sequence's K/V rows live in one paged pool (kv/paged_pool.h), and a decode step runs all of
// them as one batch through the model: one row per sequence in every linear layer, and the
// paged attention kernel reading each sequence's blocks. Prompts are prefilled a chunk at a
// time, one sequence per forward pass. Full blocks of ended sequences stay in the pool as an
// automatic prefix cache, found again by their tokens.
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/graph.h"
#include "backend/kernel_args.h"
#include "serve/cache_files.h"
#include "serve/scheduler.h"
#include "serve/serve_stats.h"
#include "kv/paged_cache.h"
#include "kv/paged_pool.h"
#include "kv/paged_pools.h"
#include "model/model.h"

namespace osprey {

struct PagedBackendOptions {
  int max_sequences = 1;     // -np: sequences decoding at once
  int64_t context_size = 0;  // 0: the model's max_position_embeddings
  int64_t block_size = 16;   // rows per block
  // The pool's size in bytes. 0: room for max_sequences full contexts, and on CUDA at most
  // kv_memory_fraction of the device memory free once the weights are in.
  int64_t kv_cache_bytes = 0;
  double kv_memory_fraction = 0.9;
  bool prefix_cache = true;  // keep ended sequences' full blocks for later prompts
  // CUDA: decode steps run as graphs, one captured per bucket (batch size 1, 2, 4, ... up to
  // max_sequences, by table width 8, 16, 32, ... blocks up to one context) and replayed with the
  // step's inputs uploaded into the bucket's arrays.
  bool graphs = true;
  // CUDA: sampled inputs are drawn on the device (ops::sample_rows), only their tokens read
  // back; off, their logits go to the host, whose sampler draws them (OSPREY_CUDA_SAMPLE_ROWS).
  bool device_sampling = true;
  // Keys per split of the paged attention (a multiple of 64). 0: 128 with batch invariance on,
  // else by bucket (64 for buckets of 1 and 2, 128 up to 8, 1024 beyond; measured on the H200).
  int64_t split_keys = 0;
  // OSPREY_KV_INPLACE_WRITE: off, every K/V write is a copying write (PagedPoolParams::inplace).
  bool inplace = true;
  // The most prompt rows one prefill chunk writes (the scheduler's prefill_chunk). A
  // sliding-window group holds about a window plus one chunk per sequence (kv/paged_pools.h).
  int64_t prefill_chunk = 512;
  // The most rows one speculative verify writes (the draft's --draft-max plus the last token;
  // 0: no drafting). A sliding-window group also holds those rows while they wait for a rewind.
  int64_t verify_rows = 0;
  // --cache-type-k / --cache-type-v: the pool's key and value types (KVCacheParams::k_type,
  // v_type); unset: the model's.
  std::optional<DType> k_type, v_type;
};

// With a prompt store attached (CacheFiles::attach_store), the blocks a sequence adds to the
// prefix cache when it ends (one run of full blocks continuing a cached chain) are handed to the
// store to be written in the background (paged files: one per such run), and a hit refreshes
// the recency of the files holding the blocks it used.
class PagedBackend final : public SequenceBackend, public CacheFiles {
 public:
  // `model` must outlive the backend. Throws InvalidInput for a bad size (naming the option).
  PagedBackend(Model& model, const PagedBackendOptions& options);
  ~PagedBackend() override;

  int max_running() const override { return int(seqs_.size()); }
  int64_t context_size() const override { return context_; }
  std::optional<Begun> begin(std::span<const int32_t> prompt, const std::string& cache_salt) override;
  // The prompt's images (Gemma 3): a prefill chunk holding some is run in passes that each end
  // with an image (run_prefill).
  void set_images(int handle, std::vector<ImageSpan> images) override;
  void prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) override;
  // CUDA: a greedy or (with device_sampling) sampled first token is chosen on the device from
  // the chunk's last row, as decode() chooses: only the token id crosses to the host.
  int32_t prefill_and_choose(int handle, std::span<const int32_t> tokens, const DecodeInput& choice,
                             std::vector<float>& logits) override;
  void decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs, const MaskFn& masks) override;
  bool reserve(int handle, int64_t n) override;
  // Speculative decoding (docs/design.md, "Speculative decoding"): every running sequence
  // verifies. verify() runs the rows as a decode step of one row per token over the sequence's
  // own block table (row i a query at the sequence's length + i), in batch-invariant mode, so
  // each row is the one-row step bit for bit; its K/V rows go into blocks the sequence holds
  // alone (reserve's copy-on-write). rewind() truncates every group back by at most the last
  // verify's rows; no windowed group gives a block back between a verify and its rewind.
  bool can_verify(int handle) const override;
  void verify(int handle, std::span<const int32_t> tokens, std::vector<float>& logits) override;
  // Every item's rows in one decode pass (a varlen batch: an entry per row of every item).
  void verify_batch(std::span<const VerifyInput> items, std::vector<std::vector<float>>& logits) override;
  void rewind(int handle, int64_t n) override;
  // A sequence sharing every block of `handle` (PagedPool::fork); nullopt when no slot is free.
  std::optional<int> fork(int handle) override;
  void end(int handle, std::span<const int32_t> tokens) override;
  double kv_usage() const override;
  KVCounters kv_counters() const override;

  // Thread-safe.
  // The prefix cache as the prompt cache of this layout (serve/serve_stats.h).
  PromptCacheStats prefix_stats() const;
  // Every group's counts added up (blocks of different groups differ in size).
  PagedPoolStats pool_stats() const;
  int64_t block_size() const { return options_.block_size; }
  const PagedPools& pools() const { return *pools_; }
  uint64_t n_graph_replays() const { return n_graph_replays_; }
  uint64_t n_graph_captures() const { return n_graph_captures_; }

  // CacheFiles
  int64_t attach_store(PromptStore& store) override;
  int n_slot_ids() const override { return int(seqs_.size()); }
  std::optional<PromptFileData> slot_file(int slot) override;
  int64_t restore_slot(int slot, const PromptFileData& data) override;
  int64_t erase_slot(int slot) override;

 private:
  // The rows of blocks [first, end) of the chain of `tokens` as a paged file's data (CPU
  // copies): the sequence's blocks, or a windowed group's cached ones; nullopt when a windowed
  // group holds some of them no more.
  std::optional<PromptFileData> run_file(PagedPool::SeqId id, std::span<const int32_t> tokens, int64_t first,
                                         int64_t end, const std::string& salt);
  // Puts a paged file's blocks into the prefix cache after the chain of its first rows, which
  // must be cached already; returns the rows of the file's chain now cached (its length, or
  // less when the pool has no room), or nullopt when the chain it continues is not cached.
  std::optional<int64_t> insert_run(const PromptFileData& data);
  struct Seq {
    bool busy = false;
    PagedPool::SeqId id = -1;
    std::string salt;  // its prompt-cache salt
    // The token of each row written so far, kept where a windowed group caches its blocks by
    // them before it gives them back (the model has windows and the prefix cache is on).
    std::vector<int32_t> tokens;
    std::vector<ImageSpan> images;  // the prompt's images (set_images), by position
    // Rows of the last write that a rewind may give back: the last verify's, until the next
    // write or rewind.
    int64_t rewindable = 0;
  };
  // A decode step's inputs for batches of up to `size` sequences, in device arrays that stay
  // put (views of one buffer uploaded per step), and the step captured over them.
  struct Bucket {
    int64_t size = 0;
    int64_t width = 0;  // blocks per table row
    // i32 [3 * size + groups * (size + size * width)] on the CPU: tokens, positions, lens, then
    // each group's slots and tables.
    Array host;
    Array device;
    Array tokens, positions, lens;  // views of `device`
    std::vector<Array> slots, tables;  // per group, views of `device`
    std::unique_ptr<CapturedGraph> graph;
    uint64_t memory_generation = 0;
    Array logits;  // [size, vocab], what the graph writes
    int64_t split_keys = 0;   // of the paged attention, fixed per bucket
    bool invariant = false;   // ops::batch_invariant() when the graph was captured
    bool warm = false;  // ran eagerly once: every scratch buffer has its size
  };
  // The bucket for b sequences whose longest needs `blocks` blocks.
  Bucket& bucket_for(int64_t b, int64_t blocks);
  // Sizes the pools' groups from the options (kv_cache_bytes, or every sequence's full context
  // capped by the device's free memory) and logs them.
  PagedPoolsParams size_pools();
  // Blocks a sequence of `rows` rows holds at most in a group of window w (0: full attention;
  // a windowed group: its window and a chunk).
  int64_t seq_blocks(int64_t w, int64_t rows) const;
  // Blocks of an ended sequence's window in a group of window w > 0 (what its next turn needs).
  int64_t tail_blocks(int64_t w) const;
  // After rows were committed: the tokens they hold appended, and the windowed groups' blocks
  // that no later query sees given back (cached first when the prefix cache is on).
  void advance(Seq& s, std::span<const int32_t> tokens);
  // The windowed groups give back (and cache, with the prefix cache on) the blocks no query at
  // the sequence's length or later sees. Called only where every row is settled (no verify
  // waits for its rewind), so a cached block never holds a rejected draft's row.
  void release_behind(Seq& s);
  // Whether s.tokens follows the rows (a windowed group caches its blocks by them).
  bool keeps_tokens() const;
  // Keys per split of the paged attention for a step of `size` rows.
  int64_t split_keys(int64_t size) const;
  Seq& seq(int handle);
  void publish_stats();
  // The masked inputs' token masks (asked of `masks`) as u32 [inputs, ceil(vocab / 32)] on the
  // device, every id allowed in an unmasked row; undefined when no input is masked.
  Array device_masks(std::span<const DecodeInput> inputs, int64_t vocab, const MaskFn& masks);
  // Writes the chunk's rows into the pool; returns its logits [n, vocab] on the device (the
  // last pass's rows when the chunk holds images).
  Array run_prefill(int handle, std::span<const int32_t> tokens);
  // One pass of run_prefill: `images` lie wholly inside it (the last one ending with it).
  Array run_pass(Seq& s, std::span<const int32_t> tokens, std::span<const ImageSpan> images);
  // Whether the device chooses `in`'s token (CUDA, greedy or drawn).
  bool device_chooses(const DecodeInput& in) const;
  // Chooses, on the device, the tokens of the inputs that device_chooses() from `logits`
  // ([b, vocab], one row per input) into outputs[i].token (or .error).
  void choose_on_device(std::span<const DecodeInput> inputs, Array logits, std::vector<DecodeOutput>& outputs,
                        const MaskFn& masks);
  // The device sampler's parameters of the step's inputs into row_args_ and row_adjust_.
  void build_row_args(std::span<const DecodeInput> inputs);

  Model& model_;
  PagedBackendOptions options_;
  int64_t context_ = 0;
  std::unique_ptr<PagedPools> pools_;
  PagedStep step_;
  SequenceCache step_cache_;  // views of pools_ reading step_
  std::vector<Seq> seqs_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  int64_t table_width_ = 0;  // blocks of one full context: every bucket's table row
  uint64_t n_graph_replays_ = 0, n_graph_captures_ = 0;
  Array mask_host_;  // device_masks()'s staging rows, kept between steps
  std::vector<SampleRowArgs> row_args_;  // build_row_args()'s, kept between steps
  std::vector<LogitAdjust> row_adjust_;
  mutable std::mutex stats_mu_;
  PromptCacheStats prefix_;      // guarded by stats_mu_; the pool's counts are filled in on reading
  PagedPoolStats pool_stats_;    // guarded by stats_mu_: every group's counts added up
  int64_t bytes_in_use_ = 0, bytes_cached_ = 0;  // guarded by stats_mu_
  KVCounters counters_;          // guarded by stats_mu_
  PromptStore* store_ = nullptr;  // attach_store's
  // What each sequence slot's last finished sequence left in the prefix cache: the tokens of
  // its full blocks, and its salt.
  std::vector<std::pair<std::vector<int32_t>, std::string>> last_;
};

}  // namespace osprey
