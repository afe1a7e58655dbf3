#include "serve/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <optional>

#include "backend/ops.h"
#include "backend/sample_noise.h"
#include "core/error.h"
#include "core/log.h"
#include "grammar/matcher.h"
#include "serve/draft_model.h"

namespace osprey {
namespace {

// A prefill chunk of `n` prompt tokens from `at`, moved so that no image is cut: it ends before
// an image it would cut, or (starting at the image) takes the whole image past the budget.
int64_t image_chunk(const std::vector<ImageSpan>& images, int64_t at, int64_t n) {
  for (const ImageSpan& im : images) {
    const int64_t b = im.pos0, e = im.pos0 + im.embeds.dim(0);
    if (b < at + n && at + n < e) return b > at ? b - at : e - at;
  }
  return n;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

const char* kShuttingDown = "the server is shutting down";

}  // namespace

int64_t sequence_context(int64_t requested, int64_t model_context) {
  const int64_t context = requested > 0 ? requested : model_context;
  if (model_context > 0 && context > model_context)
    throw InvalidInput("--ctx-size " + std::to_string(context) + " exceeds the model's max_position_embeddings (" +
                       std::to_string(model_context) + ")");
  if (context < 2) throw InvalidInput("--ctx-size must be >= 2");
  return context;
}

void check_prompt(std::span<const int32_t> prompt, int64_t context, int64_t vocab) {
  if (prompt.empty()) throw InvalidInput("the prompt is empty");
  if (int64_t(prompt.size()) > context)
    throw InvalidInput("the prompt (" + std::to_string(prompt.size()) + " tokens) exceeds the context of " +
                       std::to_string(context));
  ops::check_token_ids(prompt, vocab, "prompt token id");
}

uint64_t choice_seed(uint64_t seed, uint64_t index) {
  if (index == 0) return seed;
  uint64_t z = seed + index * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- SequenceChannel ----

void SequenceChannel::push(SequenceEvent event) {
  event.time = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

std::optional<SequenceEvent> SequenceChannel::pop(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); })) return std::nullopt;
  SequenceEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void SequenceChannel::cancel() {
  cancelled_.store(true);
  std::function<void()> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = wake_;
  }
  if (wake) wake();
}

void SequenceChannel::set_wake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
}

// ---- Scheduler ----

struct Scheduler::Sequence {
  SequenceRequest request;
  Sampler sampler;
  std::optional<grammar::Matcher> matcher;  // constrained decoding
  std::vector<int32_t> tokens;  // prompt, then every emitted token
  int handle = -1;              // the backend's, once begun
  int64_t n_cached = 0;
  int64_t n_in_cache = 0;       // leading tokens whose K/V the cache holds
  int64_t n_generated = 0;
  bool decoding = false;        // the prompt is in; the last token waits to be fed
  bool ended = false;
  bool resumed = false;         // preempted once: tokens holds prompt and output so far
  bool preempted = false;       // this step: goes back to the queue
  bool greedy = false;          // the backend may choose the token (DecodeInput::greedy) ...
  bool sampled = false;         // ... or draw it (DecodeInput::sampling) ...
  bool masked = false;          // ... from the matcher's mask (DecodeInput::masked)
  // Speculative decoding: tokens drafted and accepted, and rows a verify wrote past n_in_cache
  // that are not given back yet (end_sequence gives them back before the backend's end()).
  int64_t n_drafted = 0, n_accepted = 0, n_unsettled = 0;
  bool spec_stepped = false;    // this step's token came from a speculative step
  DraftPacer pacer;             // when it drafts (stops for low acceptance, backs off)
  int draft_handle = -1;        // the draft model's cache of the sequence (ModelDrafter)
  Clock::time_point admitted{};  // first begun: the end of its queue wait

  Sequence(SequenceRequest r, float min_acceptance)
      : request(std::move(r)), sampler(request.params.sampler), tokens(request.prompt), pacer(min_acceptance) {
    const SamplerParams& sp = request.params.sampler;
    // Logprobs need the logits on the host; every other sequence leaves its token to the
    // backend, which chooses it on the device where it can.
    const bool logprobs = request.params.n_top_logprobs >= 0;
    greedy = sp.temperature <= 0 && !uses_history(sp) && !logprobs;
    sampled = !greedy && !logprobs;
    masked = (greedy || sampled) && request.params.grammar;
    if (request.params.grammar) matcher.emplace(request.params.grammar);
  }
  int64_t n_prompt() const { return int64_t(request.prompt.size()); }
  // Tokens the cache must hold before the next token is decoded: the prompt (whose last
  // logits choose the first token), or after a preemption everything but the last token,
  // which the next decode step feeds.
  int64_t n_target() const { return resumed ? int64_t(tokens.size()) - 1 : n_prompt(); }
};

Scheduler::Scheduler(SequenceBackend& backend, const SchedulerOptions& options) : backend_(backend), options_(options) {
  if (options_.max_queue < 0) throw InvalidInput("scheduler: max_queue must be >= 0");
  if (options_.prefill_chunk < 1) throw InvalidInput("scheduler: prefill_chunk must be >= 1");
  if (options_.spec.enabled()) validate(options_.spec);
  if (!options_.spec.model_draft.empty()) {
    if (!options_.draft_model) throw InvalidInput("--model-draft " + options_.spec.model_draft + ": the draft model is not loaded");
    DraftModelOptions d;
    d.cache = options_.draft_cache;
    d.graphs = options_.draft_graphs;
    d.p_min = options_.spec.draft_p_min;
    // target_vocab left 0: a draft id past the target's vocabulary is never accepted (the
    // target's row gives it no mass), and check_draft_compatible has compared the two.
    drafter_ = std::make_unique<ModelDrafter>(*options_.draft_model, d);
  }
  if (options_.engine_thread) thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::wake() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

Scheduler::Submit Scheduler::submit(SequenceRequest request) {
  if (request.prompt.empty()) throw InvalidInput("the prompt is empty");
  if (!request.channel) throw InvalidInput("scheduler: a request needs a channel");
  if (request.params.max_tokens < 1) throw InvalidInput("max_tokens must be >= 1");
  if (int64_t(request.forks.size()) + 1 > backend_.max_running())
    throw InvalidInput("a request of " + std::to_string(request.forks.size() + 1) + " choices exceeds the " +
                       std::to_string(backend_.max_running()) + " sequences the server runs at once");
  for (const SequenceFork& f : request.forks) {
    if (!f.channel) throw InvalidInput("scheduler: a fork needs a channel");
    if (f.params.max_tokens < 1) throw InvalidInput("max_tokens must be >= 1");
    validate(f.params.sampler);
    f.channel->set_wake([this] { wake(); });
  }
  auto seq = std::make_unique<Sequence>(std::move(request), options_.spec.min_acceptance);  // validates the sampler
  seq->request.channel->set_wake([this] { wake(); });
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!device_lost_.empty()) return Submit::device_lost;
    if (stopping_) return Submit::stopping;
    std::erase_if(waiting_, [](const auto& s) { return s->request.channel->cancelled(); });
    if (int64_t(waiting_.size()) >= options_.max_queue) return Submit::queue_full;
    waiting_.push_back(std::move(seq));
    stats_.n_waiting = int64_t(waiting_.size());
  }
  cv_.notify_all();
  return Submit::accepted;
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  } else if (!shut_) {
    shut_down(kShuttingDown);  // the caller ran the steps: it ends what is left
  }
  shut_ = true;
  mask_worker_.stop();
}

std::string Scheduler::device_lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_lost_;
}

bool Scheduler::note_device_lost(const std::exception& e) {
  if (!dynamic_cast<const DeviceLost*>(&e)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (device_lost_.empty()) device_lost_ = e.what();
  return true;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Scheduler::run_on_engine(const std::function<void()>& fn) {
  std::promise<void> done;
  std::function<void()> task = [&] {
    try {
      fn();
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  };
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) {
      lock.unlock();
      fn();
      return;
    }
    engine_tasks_.push_back(&task);
  }
  cv_.notify_all();
  done.get_future().get();
}

Scheduler::Submit Scheduler::run_job(const std::function<void()>& job) {
  std::promise<void> done;
  std::function<void()> task = [&] {
    try {
      job();
      done.set_value();
    } catch (const std::exception& e) {
      note_device_lost(e);  // the loop then stops as after a step that met it
      done.set_exception(std::current_exception());
    } catch (...) {
      done.set_exception(std::current_exception());
    }
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!device_lost_.empty()) return Submit::device_lost;
    if (stopping_) return Submit::stopping;
    // Queued here, it runs on the engine thread: between steps, or in the loop's shutdown.
    engine_tasks_.push_back(&task);
  }
  cv_.notify_all();
  done.get_future().get();
  return Submit::accepted;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !engine_tasks_.empty() || !waiting_.empty() || !running_.empty(); });
      if (stopping_) break;
    }
    if (!turn()) return;
  }
  shut_down(kShuttingDown);
}

bool Scheduler::run_step() {
  if (thread_.joinable()) throw Error("scheduler: run_step() is for a scheduler without an engine thread");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    if (engine_tasks_.empty() && waiting_.empty() && running_.empty()) return false;
  }
  if (!turn()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return !waiting_.empty() || !running_.empty();
}

bool Scheduler::turn() {
  std::vector<std::function<void()>*> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(engine_tasks_);
  }
  for (auto* t : tasks) (*t)();
  drop_cancelled_waiting();
  step();
  // A step that met DeviceLost: nothing more can run on the device, so every sequence ends
  // with its error and new ones are refused (submit) until the process is restarted.
  std::string lost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.n_waiting = int64_t(waiting_.size());
    stats_.n_running = int64_t(running_.size());
    stats_.kv_usage = backend_.kv_usage();
    stats_.kv = backend_.kv_counters();
    if (!device_lost_.empty()) {
      lost = device_lost_;
      stopping_ = true;
    }
  }
  if (lost.empty()) return true;
  shut_down("the device failed: " + lost);
  log_message(LogLevel::error, "the engine stopped: " + lost);
  if (options_.on_device_lost) options_.on_device_lost(lost);
  return false;
}

void Scheduler::shut_down(const std::string& error) {
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::function<void()>*> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting.swap(waiting_);
    tasks.swap(engine_tasks_);
  }
  for (auto* t : tasks) (*t)();
  for (auto& s : waiting) fail(*s, error);
  for (auto& s : running_) fail(*s, error);
  running_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.n_waiting = stats_.n_running = 0;
  stats_.kv_usage = backend_.kv_usage();
}

void Scheduler::drop_cancelled_waiting() {
  std::vector<std::unique_ptr<Sequence>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if ((*it)->request.channel->cancelled()) {
        dropped.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : dropped) finish(*s, "cancelled");
}

void Scheduler::end_draft(Sequence& s) {
  if (s.draft_handle < 0) return;
  try {
    drafter_->end(s.draft_handle);
  } catch (const std::exception& e) {
    log_warn("request " + std::to_string(s.request.id) + ": ending the draft failed: " + e.what());
  }
  s.draft_handle = -1;
}

SequenceEvent Scheduler::end_sequence(Sequence& s) {
  s.ended = true;
  end_draft(s);
  if (s.handle >= 0) {
    try {
      if (s.n_unsettled > 0) backend_.rewind(s.handle, s.n_unsettled);
      s.n_unsettled = 0;
      backend_.end(s.handle, std::span<const int32_t>(s.tokens).first(size_t(s.n_in_cache)));
    } catch (const std::exception& e) {
      log_warn("request " + std::to_string(s.request.id) + ": ending the sequence failed: " + e.what());
    }
    s.handle = -1;
  }
  SequenceEvent e;
  e.n_prompt = s.n_prompt();
  e.n_cached = s.n_cached;
  e.n_drafted = s.n_drafted;
  e.n_accepted = s.n_accepted;
  e.n_draft_stops = s.pacer.n_stops();
  return e;
}

bool Scheduler::can_draft(const Sequence& s) const {
  return options_.spec.enabled() && !s.matcher && s.request.params.n_top_logprobs < 0 && s.handle >= 0 &&
         backend_.can_verify(s.handle);
}

bool Scheduler::speculates(const Sequence& s) const { return !drafts_paused_ && can_draft(s); }

// A drafting sequence's verify of this step: its draft and the rows fed (the last token, then
// the draft).
struct Scheduler::Drafted {
  Sequence* s = nullptr;
  DraftProposal proposal;
  std::vector<int32_t> feed;
};

bool Scheduler::draft(Sequence& s, Drafted& d) {
  const SpeculativeParams& sp = options_.spec;
  // k drafted rows and the last token's: the cache must hold them, and the step emits up to
  // k + 1 tokens within max_tokens.
  const int64_t room = backend_.context_size() - s.n_in_cache - 1;
  const int64_t left = s.request.params.max_tokens - s.n_generated - 1;
  const int64_t k_max = std::min<int64_t>({int64_t(sp.draft_max), room, left});
  if (k_max < sp.draft_min) return false;
  const SamplerParams& sampler = s.request.params.sampler;
  const auto t0 = Clock::now();
  if (drafter_) {
    try {
      if (s.draft_handle < 0) s.draft_handle = drafter_->begin();
      d.proposal = drafter_->draft(s.draft_handle, s.tokens, int(k_max), sampler, uint64_t(s.n_generated));
    } catch (const std::exception& e) {
      note_device_lost(e);
      fail(s, std::string("drafting failed: ") + e.what(), std::current_exception());
      return true;
    }
  } else {
    d.proposal.tokens = ngram_draft(s.tokens, sp.ngram_min, sp.ngram_max, int(k_max));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.decode_seconds += seconds_since(t0);
  }
  const std::vector<int32_t>& draft = d.proposal.tokens;
  if (int64_t(draft.size()) < sp.draft_min) return false;
  if (!make_room(s, int64_t(draft.size()) + 1)) return true;  // preempted or failed: nothing more this step
  d.s = &s;
  d.feed.reserve(draft.size() + 1);
  d.feed.push_back(s.tokens.back());
  d.feed.insert(d.feed.end(), draft.begin(), draft.end());
  return true;
}

void Scheduler::speculative_steps() {
  // The batch policy (--spec-max-batch): past it, a verify's rows, each its own matvec in
  // batch-invariant mode, cost more than the step's batched rows they replace
  // (docs/design.md, "When a sequence drafts").
  int64_t n_decoding = 0;
  for (auto& s : running_) {
    s->spec_stepped = false;
    if (!s->ended && !s->preempted && s->decoding) ++n_decoding;
  }
  drafts_paused_ = options_.spec.enabled() && options_.spec.max_batch > 0 && n_decoding > options_.spec.max_batch;
  if (drafts_paused_) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.n_draft_paused_steps;
    return;
  }
  std::vector<Drafted> drafted;
  for (auto& s : running_) {
    if (s->ended || s->preempted || !s->decoding || !speculates(*s)) continue;
    if (!s->pacer.drafts()) continue;  // backing off: a plain step
    Drafted d;
    s->spec_stepped = draft(*s, d);
    if (!d.feed.empty()) drafted.push_back(std::move(d));
  }
  // A later sequence's room may have preempted an earlier one.
  std::erase_if(drafted, [](const Drafted& d) { return d.s->ended || d.s->preempted; });
  if (drafted.empty()) return;
  std::vector<SequenceBackend::VerifyInput> items;
  for (const Drafted& d : drafted) items.push_back({d.s->handle, d.feed});
  std::vector<std::vector<float>> logits;
  const auto t0 = Clock::now();
  try {
    backend_.verify_batch(items, logits);
  } catch (const std::exception& e) {
    note_device_lost(e);
    for (Drafted& d : drafted) fail(*d.s, std::string("decode failed: ") + e.what(), std::current_exception());
    return;
  }
  for (size_t i = 0; i < drafted.size(); ++i) accept_drafts(*drafted[i].s, drafted[i], logits[i]);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.decode_seconds += seconds_since(t0);
}

void Scheduler::accept_drafts(Sequence& s, const Drafted& d, std::span<const float> logits) {
  const DraftProposal& proposal = d.proposal;
  const std::vector<int32_t>& draft = proposal.tokens;
  const SamplerParams& sampler = s.request.params.sampler;
  const int64_t k = int64_t(draft.size());
  const size_t vocab = logits.size() / size_t(k + 1);
  const int64_t base = s.n_in_cache;  // rows before the verify; it wrote base .. base + k
  s.n_drafted += k;
  int64_t accepted = 0;
  // Row i's logits choose the token after feed[0..i]. A point-mass draft (n-grams, a greedy
  // request's draft model): the row's token is emitted as a one-row step's would be (the same
  // sampler, counter and history) and the draft's is accepted when it is that token. A sampled
  // draft (proposal.q): the draft's token x is accepted with probability min(1, p(x) / q(x)),
  // else the emitted token is drawn from max(0, p - q) (speculative_accept), with noise of
  // the verify stream at the token's counter. The first rejection ends the step; with every
  // draft accepted, the last row's token is the target's own draw.
  const bool sampled_draft = !proposal.q.empty();
  const uint64_t verify_seed = verify_noise_seed(sampler.seed);
  for (int64_t i = 0; i <= k; ++i) {
    s.n_in_cache = base + 1 + i;
    s.n_unsettled = k - i;
    bool going = false, accept = false;
    try {
      const std::span<const float> row = std::span<const float>(logits).subspan(size_t(i) * vocab, vocab);
      if (sampled_draft && i < k) {
        const uint64_t c = uint64_t(s.n_generated);
        const TokenDistribution p = s.sampler.distribution(row, s.tokens);
        const SpeculativeVerdict v = speculative_accept(p, proposal.q[size_t(i)], draft[size_t(i)],
                                                        noise_uniform(verify_seed, c, 0), noise_uniform(verify_seed, c, 1));
        accept = v.accepted;
        going = emit(s, row, v.token);
      } else {
        going = emit(s, row);
        accept = going && i < k && s.tokens.back() == draft[size_t(i)];
      }
    } catch (const std::exception& e) {
      note_device_lost(e);
      fail(s, std::string("decode failed: ") + e.what(), std::current_exception());
      break;
    }
    if (!going) break;  // ended: end_sequence gave the unsettled rows back
    if (i == k || !accept) break;
    ++accepted;
    ++s.n_accepted;  // before the next emit, whose end of the sequence reports it
  }
  if (!s.ended && s.n_unsettled > 0) {
    try {
      backend_.rewind(s.handle, s.n_unsettled);
      s.n_unsettled = 0;
    } catch (const std::exception& e) {
      note_device_lost(e);
      fail(s, std::string("decode failed: ") + e.what(), std::current_exception());
    }
  }
  const int64_t stops = s.pacer.n_stops();
  s.pacer.verified(k, accepted);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.n_drafted_tokens += uint64_t(k);
  stats_.n_accepted_tokens += uint64_t(accepted);
  stats_.n_draft_stops += uint64_t(s.pacer.n_stops() - stops);
  ++stats_.n_verify_steps;
}

void Scheduler::finish(Sequence& s, const std::string& reason) { close(s, SequenceEvent::Kind::finished, reason); }

void Scheduler::fail(Sequence& s, const std::string& error, std::exception_ptr exception) {
  close(s, SequenceEvent::Kind::failed, error, std::move(exception));
}

void Scheduler::close(Sequence& s, SequenceEvent::Kind kind, const std::string& why, std::exception_ptr exception) {
  if (s.ended) return;
  SequenceEvent e = end_sequence(s);
  e.kind = kind;
  e.exception = std::move(exception);
  const bool failed = kind == SequenceEvent::Kind::failed;
  (failed ? e.error : e.finish_reason) = why;
  // Forks not yet started end as their prompt's sequence did.
  std::vector<SequenceFork> forks;
  forks.swap(s.request.forks);
  {
    // Counted before the events go out: a client that has its reply sees it in /metrics.
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t& count = failed ? stats_.n_failed : why == "cancelled" ? stats_.n_cancelled : stats_.n_finished;
    count += 1 + forks.size();
  }
  for (const SequenceFork& f : forks) f.channel->push(e);
  s.request.channel->push(std::move(e));
}

void Scheduler::start_forks(Sequence& s, std::span<const float> logits) {
  std::vector<SequenceFork> forks;
  forks.swap(s.request.forks);
  for (SequenceFork& f : forks) {
    SequenceRequest r;
    r.id = s.request.id;
    r.cache_salt = s.request.cache_salt;
    r.prompt = s.request.prompt;
    r.params = std::move(f.params);
    r.channel = std::move(f.channel);
    auto fork = std::make_unique<Sequence>(std::move(r), options_.spec.min_acceptance);
    fork->admitted = s.admitted;
    fork->n_cached = s.n_cached;
    std::optional<int> handle;
    try {
      handle = backend_.fork(s.handle);
    } catch (const std::exception& e) {
      note_device_lost(e);
      fail(*fork, std::string("prefill failed: ") + e.what());
      continue;
    }
    if (!handle) {
      // The backend cannot share the cache: the choice computes its prompt itself, next.
      std::lock_guard<std::mutex> lock(mu_);
      waiting_.push_front(std::move(fork));
      continue;
    }
    fork->handle = *handle;
    fork->n_in_cache = s.n_in_cache;
    fork->decoding = true;
    running_.push_back(std::move(fork));
    Sequence& started = *running_.back();
    if (started.request.channel->cancelled()) {
      finish(started, "cancelled");
      continue;
    }
    try {
      emit(started, logits);
    } catch (const std::exception& e) {
      note_device_lost(e);
      fail(started, std::string("prefill failed: ") + e.what());
    }
  }
}

bool Scheduler::emit(Sequence& s, std::span<const float> logits, int32_t chosen) {
  SequenceEvent e;
  e.admitted = s.admitted;
  std::span<const uint64_t> allowed;
  if (s.matcher) allowed = s.matcher->mask();
  // The draw's counter is the token's index in the reply, wherever it is drawn (here or on
  // the device), so a seed repeats the reply on any backend.
  e.token = chosen >= 0 ? chosen : s.sampler.sample_at(logits, s.tokens, allowed, uint64_t(s.n_generated));
  const SequenceParams& p = s.request.params;
  if (p.n_top_logprobs >= 0) {
    // log-softmax of the raw logits, in double
    double mx = -HUGE_VAL;
    for (float l : logits) mx = std::max(mx, double(l));
    double sum = 0;
    for (float l : logits) sum += std::exp(double(l) - mx);
    const double lse = mx + std::log(sum);
    e.logprob = float(double(logits[size_t(e.token)]) - lse);
    const size_t k = std::min(size_t(p.n_top_logprobs), logits.size());
    if (k > 0) {
      std::vector<int32_t> ids(logits.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
      std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(), [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
      });
      for (size_t i = 0; i < k; ++i) e.top_logprobs.push_back({ids[i], float(double(logits[size_t(ids[i])]) - lse)});
    }
  }
  if (std::find(p.stop_ids.begin(), p.stop_ids.end(), e.token) != p.stop_ids.end()) {
    finish(s, "stop");
    return false;
  }
  if (s.matcher && !s.matcher->accept(e.token)) {
    const std::string why = "the grammar rejected token " + std::to_string(e.token);
    fail(s, why, std::make_exception_ptr(InvalidInput(why)));
    return false;
  }
  if (s.n_generated == 0) {
    e.n_prompt = s.n_prompt();
    e.n_cached = s.n_cached;
  }
  s.tokens.push_back(e.token);
  ++s.n_generated;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.n_generated_tokens;
  }
  s.request.channel->push(std::move(e));
  if (s.matcher && s.matcher->must_end()) {
    finish(s, "stop");
    return false;
  }
  if (s.n_generated >= p.max_tokens || s.n_in_cache + 1 > backend_.context_size()) {
    finish(s, "length");
    return false;
  }
  return true;
}

void Scheduler::preempt(Sequence& s) {
  end_draft(s);
  try {
    backend_.end(s.handle, std::span<const int32_t>(s.tokens).first(size_t(s.n_in_cache)));
  } catch (const std::exception& e) {
    log_warn("request " + std::to_string(s.request.id) + ": releasing a preempted sequence failed: " + e.what());
  }
  s.handle = -1;
  s.n_in_cache = 0;
  s.decoding = false;
  s.preempted = true;
  // With output so far, the next admission computes prompt and output and goes on decoding.
  s.resumed = s.n_generated > 0;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.n_preempted;
}

bool Scheduler::make_room(Sequence& s, int64_t n) {
  while (!backend_.reserve(s.handle, n)) {
    Sequence* victim = nullptr;
    int n_live = 0;
    for (auto& r : running_)
      if (!r->ended && !r->preempted) {
        victim = r.get();
        ++n_live;
      }
    if (victim == &s && n_live == 1) {
      fail(s, "the KV pool cannot hold this sequence (" + std::to_string(s.n_in_cache + n) +
                  " tokens); give the server more KV memory (--kv-cache-mib) or a smaller request");
      return false;
    }
    preempt(*victim);
    if (victim == &s) return false;
  }
  return true;
}

void Scheduler::requeue_preempted() {
  std::vector<std::unique_ptr<Sequence>> back;
  for (auto& r : running_)
    if (r->preempted && !r->ended) back.push_back(std::move(r));
  if (back.empty()) return;
  std::erase_if(running_, [](const auto& r) { return !r; });
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = back.rbegin(); it != back.rend(); ++it) {
    (*it)->preempted = false;
    waiting_.push_front(std::move(*it));
  }
}

void Scheduler::step() {
  for (auto& s : running_)
    if (s->request.channel->cancelled()) finish(*s, "cancelled");

  // Room for one more row of every decoding sequence, oldest first (preempting the newest).
  for (auto& s : running_)
    if (!s->ended && !s->preempted && s->decoding) make_room(*s, 1);

  // Speculating sequences with a draft take their multi-row step (one token or more each).
  speculative_steps();

  decode_running();

  // Admit waiting prompts in chunks while the step's budget allows.
  int64_t budget = options_.prefill_chunk;
  std::vector<float> logits;
  while (budget > 0) {
    bool retry = false;
    Sequence* s = next_to_prefill(retry);
    if (retry) continue;
    if (!s || !prefill_chunk(*s, budget, logits)) break;
  }
  requeue_preempted();
  std::erase_if(running_, [](const auto& s) { return s->ended; });
}

void Scheduler::decode_running() {
  std::vector<SequenceBackend::DecodeInput> inputs;
  std::vector<Sequence*> decoding;
  for (auto& s : running_)
    if (!s->ended && !s->preempted && s->decoding && !s->spec_stepped) {
      SequenceBackend::DecodeInput in;
      in.handle = s->handle;
      in.token = s->tokens.back();
      in.greedy = s->greedy;
      in.masked = s->masked;
      if (s->sampled) {
        in.sampling = &s->request.params.sampler;
        in.counter = uint64_t(s->n_generated);
        in.history = s->tokens;
      }
      // The token chosen here is fed to the next step unless it ends the sequence (or a
      // speculating sequence's next step is a verify, which no step enqueued ahead can be).
      in.invariant = speculates(*s);
      in.more = !can_draft(*s) && s->n_generated + 1 < s->request.params.max_tokens &&
                s->n_in_cache + 2 <= backend_.context_size();
      inputs.push_back(in);
      decoding.push_back(s.get());
    }
  if (!inputs.empty()) {
    std::vector<SequenceBackend::DecodeOutput> outputs;
    const auto t0 = Clock::now();
    // The token masks of the constrained sequences depend only on the tokens so far: the mask
    // worker computes them (into their automata's caches) while the backend runs the step, and
    // is waited for before anything else touches a matcher. A mask that fails there fails
    // again, with its sequence, in emit().
    std::vector<grammar::Matcher*> constrained;
    for (Sequence* s : decoding)
      if (s->matcher) constrained.push_back(&*s->matcher);
    if (!constrained.empty()) mask_worker_.start(std::move(constrained));
    auto join_masks = [this] {
      try {
        mask_worker_.wait();
      } catch (const std::exception&) {
      }
    };
    // A backend that chooses greedy tokens asks for the masks once the step runs: the worker's,
    // an empty span for a sequence whose mask failed (emit() fails it).
    auto masks = [&](std::vector<std::span<const uint64_t>>& out) {
      join_masks();
      for (size_t i = 0; i < decoding.size(); ++i) {
        if (!inputs[i].masked) continue;
        try {
          out[i] = decoding[i]->matcher->mask();
        } catch (const std::exception&) {
        }
      }
    };
    try {
      try {
        backend_.decode(inputs, outputs, masks);
      } catch (...) {
        join_masks();
        throw;
      }
      join_masks();
      for (size_t i = 0; i < decoding.size(); ++i) {
        ++decoding[i]->n_in_cache;
        const SequenceBackend::DecodeOutput& o = outputs[i];
        if (!o.error.empty()) {
          fail(*decoding[i], "decode failed: " + o.error, std::make_exception_ptr(InvalidInput(o.error)));
          continue;
        }
        try {
          emit(*decoding[i], o.logits, o.token);
        } catch (const std::exception& e) {
          note_device_lost(e);
          fail(*decoding[i], std::string("decode failed: ") + e.what(), std::current_exception());
        }
      }
    } catch (const std::exception& e) {
      note_device_lost(e);
      for (Sequence* s : decoding) fail(*s, std::string("decode failed: ") + e.what(), std::current_exception());
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.decode_seconds += seconds_since(t0);
  }

}

Scheduler::Sequence* Scheduler::next_to_prefill(bool& retry) {
  for (auto& r : running_)
    if (!r->ended && !r->preempted && !r->decoding) return r.get();
  std::unique_ptr<Sequence> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n_live = 0;
    // A sequence whose prompt is not in yet holds places for its forks too.
    for (auto& r : running_) n_live += r->ended || r->preempted ? 0 : 1 + int64_t(r->request.forks.size());
    // A request of several choices waits until all of them can run at once.
    if (waiting_.empty() || n_live + 1 + int64_t(waiting_.front()->request.forks.size()) > backend_.max_running())
      return nullptr;
    next = std::move(waiting_.front());
    waiting_.pop_front();
  }
  try {
    // A resumed sequence hands over every token: the backend reuses at most all but the last,
    // which the next decode step feeds.
    auto begun = backend_.begin(next->resumed ? std::span<const int32_t>(next->tokens)
                                              : std::span<const int32_t>(next->request.prompt),
                                next->request.cache_salt);
    if (!begun) {
      std::lock_guard<std::mutex> lock(mu_);
      waiting_.push_front(std::move(next));
      return nullptr;
    }
    next->handle = begun->handle;
    next->n_in_cache = begun->n_cached;
    if (!next->request.images.empty()) backend_.set_images(begun->handle, next->request.images);
    if (!next->resumed) {
      next->n_cached = begun->n_cached;
      next->admitted = Clock::now();
    }
  } catch (const std::exception& e) {
    note_device_lost(e);
    fail(*next, e.what(), std::current_exception());
    retry = true;
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.n_cached_tokens += uint64_t(next->resumed ? 0 : next->n_cached);
  }
  running_.push_back(std::move(next));
  Sequence* s = running_.back().get();
  if (s->resumed && s->n_in_cache == s->n_target()) {
    s->decoding = true;
    retry = true;
    return nullptr;
  }
  return s;
}

bool Scheduler::prefill_chunk(Sequence& s, int64_t& budget, std::vector<float>& logits) {
  const int64_t remaining = s.n_target() - s.n_in_cache;
  const int64_t n = image_chunk(s.request.images, s.n_in_cache, std::min(budget, remaining));
  const bool last = n == remaining;
  if (!make_room(s, n)) return false;
  const auto t0 = Clock::now();
  try {
    const std::span<const int32_t> all =
        s.resumed ? std::span<const int32_t>(s.tokens) : std::span<const int32_t>(s.request.prompt);
    const std::span<const int32_t> chunk = all.subspan(size_t(s.n_in_cache), size_t(n));
    int32_t chosen = -1;
    // The first token of a prompt without forks (which need its logits) or a token mask may be
    // chosen by the backend, as a decode step's are.
    if (last && !s.resumed && s.request.forks.empty() && (s.greedy || s.sampled) && !s.masked) {
      SequenceBackend::DecodeInput choice;
      choice.greedy = s.greedy;
      if (s.sampled) {
        choice.sampling = &s.request.params.sampler;
        choice.counter = 0;
        choice.history = s.tokens;
      }
      choice.more = !can_draft(s) && 1 < s.request.params.max_tokens &&
                    s.n_in_cache + n + 1 <= backend_.context_size();
      chosen = backend_.prefill_and_choose(s.handle, chunk, choice, logits);
    } else {
      backend_.prefill(s.handle, chunk, last && !s.resumed, logits);
    }
    s.n_in_cache += n;
    budget -= n;
    if (last) {
      s.decoding = true;
      if (!s.resumed) {
        start_forks(s, logits);
        emit(s, logits, chosen);
      }
    }
  } catch (const std::exception& e) {
    const bool lost = note_device_lost(e);
    fail(s, std::string("prefill failed: ") + e.what(), std::current_exception());
    if (lost) return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.prefill_seconds += seconds_since(t0);
  stats_.n_prompt_tokens += uint64_t(n);
  return true;
}

}  // namespace osprey
