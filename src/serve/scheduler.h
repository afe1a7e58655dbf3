#pragma once
// The serving engine: one thread owns the model, its caches and its device stream; other
// threads submit sequences through a bounded FIFO queue and read their tokens back through a
// per-sequence channel. Nothing but the engine thread touches a cache.
//
// Each step of the engine (Scheduler::step) decodes one token for every running sequence, then
// admits waiting prompts in chunks while the step's prompt-token budget allows, so a long prompt
// delays the running decodes by at most one chunk per step. The model work goes through a
// SequenceBackend: the dense batch-1 backend runs the sequences of a step one after another; the
// paged backend (serve/paged_backend.h) runs them as one batch behind the same interface.
//
// When the backend's KV pool cannot hold the next rows of a sequence, the most recently admitted
// running sequence is preempted: its cache is given back (the backend may keep its full blocks
// as a cached prefix) and it returns to the front of the queue with every token it has so far,
// to be computed again when it is admitted (vLLM's recompute preemption). Its client sees
// nothing but a pause.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "sample/sampler.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "serve/mask_worker.h"
#include "serve/speculative.h"

namespace osprey {

namespace grammar {
class Automaton;
}
class Model;
class ModelDrafter;

// What one sequence asks for.
struct SequenceParams {
  int64_t max_tokens = 128;       // further capped by the backend's context
  SamplerParams sampler;
  // Constrained decoding: every token is drawn from the grammar's mask, the sequence ends
  // ("stop") once the grammar is complete and nothing may follow, and a stop id is drawn only
  // where the grammar may end (the automaton's end ids must be stop_ids). Used on the engine
  // thread only; sequences of one request may share it.
  std::shared_ptr<grammar::Automaton> grammar;
  std::vector<int32_t> stop_ids;  // generation ends after any of these (not emitted)
  int n_top_logprobs = -1;        // -1: no logprobs; 0: the chosen token's; k: and the k most likely
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;  // log-softmax of the model's raw logits
};

// One event on a sequence's channel: a token, or the end (finished or failed).
struct SequenceEvent {
  enum class Kind { token, finished, failed };
  Kind kind = Kind::token;
  int32_t token = -1;
  std::optional<float> logprob;
  std::vector<TokenLogprob> top_logprobs;  // most likely first
  // finished: "stop" (a stop id), "length" (max_tokens or the context), "cancelled".
  std::string finish_reason;
  std::string error;  // failed: why
  // failed: the exception that ended the sequence, where one did (a caller on the engine's
  // side, such as generate(), rethrows it with its type); null for a refusal by the engine.
  std::exception_ptr exception;
  // On the end: the tokens drafted for the sequence (speculative decoding) and how many of
  // them the target accepted.
  int64_t n_drafted = 0, n_accepted = 0;
  // On the end: the times the sequence stopped drafting for low acceptance (DraftPacer).
  int64_t n_draft_stops = 0;
  // On the first token and on the end: the prompt's size and how many of its tokens came
  // from the prompt cache.
  int64_t n_prompt = 0, n_cached = 0;
  // When the channel took the event, and (token events) when the engine first admitted the
  // sequence, which ends its wait in the queue.
  std::chrono::steady_clock::time_point time{}, admitted{};
};

// A single-producer (engine) single-consumer (client thread) queue of events with a cancel
// flag. Thread-safe.
class SequenceChannel {
 public:
  void push(SequenceEvent event);
  // The next event, waiting up to `timeout_ms`; nullopt on timeout.
  std::optional<SequenceEvent> pop(int timeout_ms);
  // Asks the engine to end the sequence (a client went away, a stop string matched). The
  // engine frees its resources at its next step, or at once while the sequence waits.
  void cancel();
  bool cancelled() const { return cancelled_.load(); }
  void set_wake(std::function<void()> wake);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SequenceEvent> events_;
  std::atomic<bool> cancelled_{false};
  std::function<void()> wake_;
};

// A further choice of a request's prompt (OpenAI's n > 1): its own parameters (a seed of its
// own) and channel.
struct SequenceFork {
  SequenceParams params;
  std::shared_ptr<SequenceChannel> channel;
};

struct SequenceRequest {
  uint64_t id = 0;
  std::string cache_salt;  // see SequenceBackend::begin
  std::vector<int32_t> prompt;
  // The prompt's images (Gemma 3): each span's pos0 indexes `prompt`, its soft tokens sit on
  // the model's device. The scheduler never cuts an image between two prefill chunks. The
  // images' bytes belong in cache_salt (a cached prefix is reused only under the same images).
  std::vector<ImageSpan> images;
  SequenceParams params;
  std::shared_ptr<SequenceChannel> channel;
  // More choices of the same prompt. The prompt is computed once: when it is in, each fork
  // becomes a sequence of its own that shares the prompt's cache (SequenceBackend::fork) and
  // draws its first token from the same logits. The request is admitted only when all of its
  // sequences can run at once. A request that ends before its prompt is in ends its forks the
  // same way.
  std::vector<SequenceFork> forks;
};

// The seed of choice `index` of a request seeded `seed`: the seed itself for choice 0, for the
// others a mix of both (splitmix64), so that choices draw different streams and a seed repeats
// every one of them.
uint64_t choice_seed(uint64_t seed, uint64_t index);

// The model work of the engine. Called only from the engine thread.
class SequenceBackend {
 public:
  virtual ~SequenceBackend() = default;
  // How many sequences may run at once (-np).
  virtual int max_running() const = 0;
  // Most tokens (prompt + generated) a sequence may hold.
  virtual int64_t context_size() const = 0;
  // Starts a sequence for `prompt`: returns its handle and how many leading prompt tokens are
  // already in its cache (from a prompt cache; always < prompt.size()), or nullopt when full.
  // `cache_salt` keys the prompt cache: the sequence reuses, and at end() leaves, only entries
  // of the same salt.
  struct Begun {
    int handle = -1;
    int64_t n_cached = 0;
  };
  virtual std::optional<Begun> begin(std::span<const int32_t> prompt, const std::string& cache_salt) = 0;
  // The sequence's prompt images (SequenceRequest::images), given after begin() and before its
  // first prefill; later prefills pass them to the model. The default refuses any (a backend
  // without image input names itself).
  virtual void set_images(int handle, std::vector<ImageSpan> images) {
    (void)handle;
    if (!images.empty()) throw Unsupported("image input is not supported by this serving backend");
  }
  // Appends `tokens` to the sequence's cache. When `want_logits`, writes the logits of the
  // last one into `logits` ([vocab] f32 on the host).
  virtual void prefill(int handle, std::span<const int32_t> tokens, bool want_logits, std::vector<float>& logits) = 0;
  // Decodes one token for each sequence: inputs[i] = (handle, token); logits[i] receives its
  // next-token logits ([vocab] on the host).
  struct DecodeInput {
    int handle = -1;
    int32_t token = 0;
    // The sequence samples greedily with nothing else to compute from the logits: the backend
    // may choose the token itself (argmax, the lowest id on ties) and return no logits.
    bool greedy = false;
    // A greedy or sampled input drawn from a token mask (constrained decoding) that `masks`
    // gives.
    bool masked = false;
    // A sampled input with nothing else to compute from the logits: the backend may draw the
    // token itself with these parameters (sample/sampler.h's chain; valid until decode
    // returns), at draw `counter` of the sequence, the penalties looking at `history` (the
    // sequence's tokens so far), and return no logits. nullptr: not a sampled input.
    const SamplerParams* sampling = nullptr;
    uint64_t counter = 0;
    std::span<const int32_t> history;
    // The caller will feed the token chosen here to the next step unless that token ends the
    // sequence (a stop id, the grammar's end, a cancel): a backend that chooses it on the
    // device may enqueue that step ahead, before the host reads the token (docs/design.md,
    // "Pipelined decode"), and gives its row back if the sequence ends instead (end()).
    bool more = false;
    // A speculating sequence (SchedulerOptions::spec): the step is computed in batch-invariant
    // mode (ops::set_batch_invariant), the arithmetic of its verify steps' rows.
    bool invariant = false;
  };
  struct DecodeOutput {
    int32_t token = -1;         // >= 0: the token the backend chose (greedy and sampled inputs)
    std::vector<float> logits;  // otherwise the next-token logits, [vocab] on the host
    std::string error;          // non-empty: this sequence failed (e.g. non-finite logits)
  };
  // The token masks of the masked inputs, asked for once the step's forward pass is on its way
  // (so that the caller computes them meanwhile): fills masks[i] for each masked input i with
  // a bitmask over the vocabulary (bit id % 64 of word id / 64, grammar::Matcher::mask()'s
  // layout), valid until decode returns; an empty span leaves input i unmasked.
  using MaskFn = std::function<void(std::vector<std::span<const uint64_t>>& masks)>;
  // A backend that chooses the tokens of greedy or sampled inputs calls `masks` (when there are
  // masked inputs) and takes each masked greedy input's allowed token of highest logit (the
  // lowest id on ties), or draws a masked sampled input's token from its allowed ones; an error
  // when its mask allows none. One that returns logits need not call it.
  virtual void decode(std::span<const DecodeInput> inputs, std::vector<DecodeOutput>& outputs,
                      const MaskFn& masks) = 0;
  // The last chunk of a prompt, whose next token `choice` describes (DecodeInput's fields; its
  // handle and token are not used, and it is never masked): a backend that chooses tokens may choose this one itself,
  // as decode() would, and return it (>= 0) with no logits; otherwise it writes the last
  // token's logits into `logits` and returns -1 (the default).
  virtual int32_t prefill_and_choose(int handle, std::span<const int32_t> tokens, const DecodeInput& choice,
                                     std::vector<float>& logits) {
    (void)choice;
    prefill(handle, tokens, true, logits);
    return -1;
  }
  // A new sequence holding what `handle`'s cache holds, sharing it where the backend can (the
  // paged pool's blocks, copied on the first write into a shared one); its handle, or nullopt
  // when the backend cannot share a cache, and the caller computes the prompt again for it.
  virtual std::optional<int> fork(int handle) {
    (void)handle;
    return std::nullopt;
  }
  // Makes room in the KV pool for n more rows of the sequence (before prefill or decode
  // writes them); false when the pool cannot, which the scheduler answers by preempting.
  virtual bool reserve(int handle, int64_t n) {
    (void)handle;
    (void)n;
    return true;
  }
  // Speculative decoding (docs/design.md, "Speculative decoding"). Whether verify() and
  // rewind() work for the sequence: its cache takes a verify step's rows in place and gives
  // rejected ones back (KVCache::gives_back_rows). False (the default): it is not drafted for.
  virtual bool can_verify(int handle) const {
    (void)handle;
    return false;
  }
  // Appends `tokens` (the sequence's last token, then the drafted ones) in one multi-row
  // forward pass whose rows are computed bit for bit as one-row steps in batch-invariant mode
  // compute them (DecodeInput::invariant), their K/V rows written in place; writes each row's
  // next-token logits into `logits` ([tokens.size() * vocab] f32 on the host).
  virtual void verify(int handle, std::span<const int32_t> tokens, std::vector<float>& logits) {
    (void)handle;
    (void)tokens;
    (void)logits;
  }
  // Several sequences' verifies of one step, each as verify() does it: items[i]'s logits into
  // logits[i]. A backend that can runs them in one forward pass (the paged one); the default
  // runs verify() for each.
  struct VerifyInput {
    int handle = -1;
    std::span<const int32_t> tokens;
  };
  virtual void verify_batch(std::span<const VerifyInput> items, std::vector<std::vector<float>>& logits) {
    logits.resize(items.size());
    for (size_t i = 0; i < items.size(); ++i) verify(items[i].handle, items[i].tokens, logits[i]);
  }
  // Gives back the last n rows of the sequence's cache, which its last write (a verify) wrote:
  // its length moves back and its next write goes in place there (KVCache::rewind_own_write).
  virtual void rewind(int handle, int64_t n) {
    (void)handle;
    (void)n;
  }
  // Ends the sequence. `tokens` are the tokens its cache holds, in order (prompt and reply);
  // the backend may keep the cache under them for later prompts.
  virtual void end(int handle, std::span<const int32_t> tokens) = 0;
  // The fraction of the KV capacity in use, in [0, 1].
  virtual double kv_usage() const = 0;
  // KV write counters of every cache the backend has run, summed.
  virtual KVCounters kv_counters() const = 0;
};

// The limits every backend applies the same way. The context of each sequence: `requested`
// when > 0, else the model's max_position_embeddings; throws InvalidInput naming --ctx-size
// when it passes the model's or is below 2.
int64_t sequence_context(int64_t requested, int64_t model_context);
// Throws InvalidInput for an empty prompt, one longer than `context`, or a token id outside
// [0, vocab).
void check_prompt(std::span<const int32_t> prompt, int64_t context, int64_t vocab);

struct SchedulerOptions {
  int max_queue = 64;            // waiting sequences past this are refused (HTTP 429)
  int64_t prefill_chunk = 512;   // prompt tokens per step (chunked prefill)
  // Called once, on the engine thread, when a step fails with DeviceLost: the engine has then
  // ended every sequence with that error and refuses new ones (a server turns unhealthy and
  // exits, for its supervisor to restart it).
  std::function<void(const std::string& error)> on_device_lost;
  // false: no engine thread; the caller runs the steps itself (Scheduler::run_step), on one
  // thread, as generate() does for one sequence.
  bool engine_thread = true;
  // Speculative decoding for every sequence (server-wide): n-gram or draft-model drafts
  // verified in one multi-row step (serve/speculative.h). Off by default. Sequences with a
  // grammar or logprobs, and those of a backend that cannot verify, decode without drafts.
  SpeculativeParams spec;
  // spec.model_draft's loaded model (serve/draft_model.h), on the target's device, checked
  // against the target (check_draft_compatible); not owned, it outlives the scheduler.
  // Required when spec.model_draft is set. Its caches take draft_cache's step and inplace.
  Model* draft_model = nullptr;
  KVCacheParams draft_cache;
  bool draft_graphs = true;
};

// Counters and gauges for /metrics. Read from any thread.
struct SchedulerStats {
  int64_t n_waiting = 0, n_running = 0;
  uint64_t n_prompt_tokens = 0;     // prompt tokens prefilled (cached tokens are not counted)
  uint64_t n_cached_tokens = 0;     // prompt tokens taken from the prompt cache
  uint64_t n_generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  uint64_t n_finished = 0, n_cancelled = 0, n_failed = 0;
  uint64_t n_preempted = 0;  // sequences sent back to the queue for want of KV blocks
  uint64_t n_drafted_tokens = 0, n_accepted_tokens = 0;  // speculative decoding
  uint64_t n_verify_steps = 0;
  // Drafting stopped for a sequence's low acceptance (DraftPacer), and steps in which drafting
  // paused because the decoding batch was larger than SpeculativeParams::max_batch.
  uint64_t n_draft_stops = 0, n_draft_paused_steps = 0;
  double kv_usage = 0;
  KVCounters kv;
};

class Scheduler {
 public:
  // Starts the engine thread. `backend` must outlive the scheduler.
  Scheduler(SequenceBackend& backend, const SchedulerOptions& options);
  ~Scheduler();  // stop()s

  enum class Submit { accepted, queue_full, stopping, device_lost };
  // Queues `request` (FIFO). Its channel receives a token event per generated token, then one
  // finished or failed event; a cancelled request gets a finished event with "cancelled".
  Submit submit(SequenceRequest request);

  // Ends every waiting and running sequence with a failed event ("the server is shutting
  // down") and joins the engine thread. Idempotent.
  void stop();

  // Without an engine thread (SchedulerOptions::engine_thread false): runs the queued tasks and
  // one step when a sequence waits or runs; returns false when none does (or the engine has
  // stopped after a DeviceLost). The caller's thread is then the engine thread.
  bool run_step();

  SchedulerStats stats() const;
  // The DeviceLost error that stopped the engine; "" while the device works.
  std::string device_lost() const;
  // Runs `fn` on the engine thread between steps and returns when it has run (for work that
  // must not race the caches: tests' inspection of stored snapshots).
  void run_on_engine(const std::function<void()>& fn);
  // Runs `job` on the engine thread between steps (work that uses the model, such as an
  // embedding forward: it never races the decode loop) and returns when it has run, rethrowing
  // what it threw: accepted. stopping or device_lost, without running it, once the engine is
  // stopping or the device has failed.
  Submit run_job(const std::function<void()>& job);

 private:
  struct Sequence;
  void loop();
  // One turn of the engine: queued tasks, cancelled waiting sequences, a step, the stats; false
  // when the engine stopped for a DeviceLost (every sequence has then ended).
  bool turn();
  // Ends every waiting and running sequence with `error` and runs the tasks still queued.
  void shut_down(const std::string& error);
  void step();
  // The step's one-token decode of every running sequence whose prompt is in and that did not
  // take a speculative step: one batch through the backend, masks computed meanwhile.
  void decode_running();
  // The next sequence whose prompt is not all in: a running one, else the first waiting one
  // admitted now; nullptr when none can go on this step. `retry`: set when the admitted one
  // failed, ended or needs no prefill (ask again).
  Sequence* next_to_prefill(bool& retry);
  // One prefill chunk of `s` within `budget` (spent by it); false when the step's prefill must
  // stop (no room, or the device was lost).
  bool prefill_chunk(Sequence& s, int64_t& budget, std::vector<float>& logits);
  void drop_cancelled_waiting();
  // Marks s ended and gives its cache back (a failure to do so is logged); the event to send,
  // with the prompt counts filled in.
  SequenceEvent end_sequence(Sequence& s);
  void finish(Sequence& s, const std::string& reason);
  void fail(Sequence& s, const std::string& error, std::exception_ptr exception = nullptr);
  // Ends `s` with a finished (`why`: the reason) or failed (`why`: the error) event.
  void close(Sequence& s, SequenceEvent::Kind kind, const std::string& why, std::exception_ptr exception = nullptr);
  // Samples the next token of `s` from `logits` (or takes `chosen`, when >= 0) and emits it;
  // returns false when `s` ended.
  bool emit(Sequence& s, std::span<const float> logits, int32_t chosen = -1);
  // Whether `s` may draft at all (SchedulerOptions::spec, no grammar, no logprobs, a backend
  // that verifies): its next step may be a verify.
  bool can_draft(const Sequence& s) const;
  // can_draft(s), and this step is not paused for the batch (drafts_paused_): its one-row step
  // runs batch-invariant and it asks its DraftPacer whether to draft.
  bool speculates(const Sequence& s) const;
  // The speculative step of every drafting sequence: each drafts from its tokens (n-grams or the
  // draft model) and makes room, the drafts are verified together (verify_batch), and each
  // emits its accepted tokens and the target's next. A sequence with no draft takes the
  // ordinary decode step (spec_stepped stays false).
  struct Drafted;
  void speculative_steps();
  // Drafts for `s` into d (d.feed: the rows to verify) and makes room for them; false when no
  // draft was found; true with d.feed empty when `s` failed or was preempted.
  bool draft(Sequence& s, Drafted& d);
  // Emits the tokens the verify's `logits` ([rows, vocab]) accept and gives the rejected rows back.
  void accept_drafts(Sequence& s, const Drafted& d, std::span<const float> logits);
  // The prompt of `s` is in: its forks become running sequences (or, where the backend cannot
  // share the cache, waiting ones) that emit their first token from `logits`.
  void start_forks(Sequence& s, std::span<const float> logits);
  // Reserves n rows for `s`, preempting the most recently admitted sequences while the backend
  // cannot; false when `s` itself was preempted or failed.
  bool make_room(Sequence& s, int64_t n);
  void preempt(Sequence& s);
  // Drops the draft model's cache of `s` (its end or preemption).
  void end_draft(Sequence& s);
  // Moves the sequences preempted during this step back to the front of the queue.
  void requeue_preempted();
  void wake();

  SequenceBackend& backend_;
  SchedulerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;          // guarded by mu_
  std::vector<std::function<void()>*> engine_tasks_;        // guarded by mu_
  bool stopping_ = false;                                   // guarded by mu_
  bool shut_ = false;  // stop() has ended every sequence (no engine thread)
  std::string device_lost_;                                 // guarded by mu_
  // Records a DeviceLost; true when `e` is one (the step's other sequences are then ended too).
  bool note_device_lost(const std::exception& e);
  std::vector<std::unique_ptr<Sequence>> running_;          // engine thread only
  SchedulerStats stats_;                                    // guarded by mu_ (engine writes)
  MaskWorker mask_worker_;                                  // driven by the engine thread
  std::unique_ptr<ModelDrafter> drafter_;                   // spec.model_draft; engine thread only
  // This step's decoding batch is larger than spec.max_batch: no sequence drafts, and their
  // one-row steps run in the default mode (engine thread only).
  bool drafts_paused_ = false;
  std::thread thread_;
};

}  // namespace osprey
