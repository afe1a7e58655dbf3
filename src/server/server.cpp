#include "server/server.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <nlohmann/json.hpp>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "backend/ops.h"
#include "bundle/model_bundle.h"
#include "bundle/model_files.h"
#include "chat/chat_template.h"
#include "chat/stop_matcher.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/generation_config.h"
#include "formats/gguf_model.h"
#include "grammar/matcher.h"
#include "model/pooling.h"
#include "serve/dense_backend.h"
#include "serve/draft_model.h"
#include "serve/paged_backend.h"
#include "serve/prompt_store.h"
#include "serve/scheduler.h"
#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/chat_reply.h"
#include "server/completion_request.h"
#include "server/embeddings.h"
#include "server/http_transport.h"
#include "server/image_parts.h"
#include "server/metrics.h"
#include "server/response_store.h"
#include "server/responses_api.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"
#include "vision/image_prompt.h"

namespace osprey {

// What the per-request log line reports; filled by the handler on its own thread (a stream's
// handler hands it on to the stream). Outside the anonymous namespace: Server::Impl keeps
// copies of it.
struct ServerRequestLog {
  std::chrono::steady_clock::time_point start{};
  uint64_t id = 0;
  int64_t n_prompt = 0, n_cached = 0, n_generated = 0;
  int64_t n_drafted = 0, n_accepted = 0;  // speculative decoding, over the sequences that ended
};

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kPollMs = 50;
constexpr int kMaxJsonDepth = 128;

thread_local ServerRequestLog t_log;
// The request on this thread was admitted and its sequences are not yet submitted.
thread_local bool t_unsubmitted = false;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump(body);
  return r;
}

// An OpenAI error body; a 429 says when to try again.
HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.status, e.body());
  if (e.status == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

ApiError api_error(int status, const std::string& type, const std::string& message, const std::string& code = "") {
  ApiError e;
  e.status = status;
  e.type = type;
  e.message = message;
  e.code = code;
  return e;
}

// J: json, or nlohmann::ordered_json to keep the client's key order.
template <class J = json>
J parse_body(const std::string& body) {
  try {
    return J::parse(body, [](int depth, typename J::parse_event_t, J&) {
      if (depth > kMaxJsonDepth) throw bad_request("the request body nests deeper than " + std::to_string(kMaxJsonDepth));
      return true;
    });
  } catch (const json::exception& e) {
    throw bad_request(std::string("the request body is not valid JSON: ") + e.what());
  }
}

// The routes counted by name in /metrics; anything else is "other".
std::string route_label(const std::string& path) {
  static const char* known[] = {"/health", "/v1/models", "/models", "/v1/completions", "/completions",
                                "/v1/chat/completions", "/chat/completions", "/v1/messages",
                                "/v1/messages/count_tokens", "/v1/responses", "/v1/embeddings", "/embeddings",
                                "/tokenize", "/detokenize", "/apply-template", "/metrics"};
  for (const char* k : known)
    if (path == k) return k;
  if (path.rfind("/slots/", 0) == 0) return "/slots/{id}";
  if (path.rfind("/v1/models/", 0) == 0 || path.rfind("/models/", 0) == 0) return "/v1/models/{id}";
  if (path.rfind("/v1/responses/", 0) == 0) return "/v1/responses/{id}";
  return "other";
}

bool equal_constant_time(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= (unsigned char)(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

// The routes of Anthropic's Messages API (server/anthropic_api.h): their errors take its shape.
bool anthropic_route(const std::string& path) { return path == "/v1/messages" || path == "/v1/messages/count_tokens"; }

// An error in the shape of the API the request's route belongs to: Anthropic's on its routes,
// OpenAI's elsewhere. A 429 says when to try again.
HttpResponse error_response(const HttpRequest& req, const ApiError& e) {
  if (!anthropic_route(req.path)) return error_response(e);
  HttpResponse r;
  r.status = e.status;
  r.body = anthropic_error_body(e).dump(-1, ' ', false, json::error_handler_t::replace);
  if (e.status == 429) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// One sequence of a request, as its client reads it: token events become text (whole UTF-8
// characters, stop strings held back and cut) and logprob entries.
struct Choice {
  std::shared_ptr<SequenceChannel> channel = std::make_shared<SequenceChannel>();
  Tokenizer::StreamDecoder decoder;
  StopMatcher stop;
  int64_t n_prompt = 0, n_cached = 0, n_completion = 0;
  // Speculative decoding: drafted and accepted tokens, from the sequence's end event (a choice
  // that a stop string ended reads none: its end comes after the reply).
  int64_t n_drafted = 0, n_accepted = 0;
  bool done = false;
  std::string finish_reason, error;
  LatencyHistograms* latency = nullptr;  // observed into, when set
  Clock::time_point arrival{}, last_token{};
  std::optional<ChatReplyParser> reply;  // chat: reasoning and tool calls split from the text
  std::vector<int32_t> keep_ids;         // special tokens the reply parser reads (call markers)
  int n_calls = 0;                       // tool calls sent so far
  const Tokenizer& tokenizer;

  Choice(const Tokenizer& t, std::vector<std::string> stops) : decoder(t), stop(std::move(stops)), tokenizer(t) {}
};

struct TokenInfo {
  int32_t id;
  float logprob;
  std::vector<TokenLogprob> top;
};

struct Delta {
  std::string text;  // content
  std::string reasoning;
  std::vector<ToolCall> calls;
  std::vector<TokenInfo> tokens;  // with logprobs only
  bool empty() const { return text.empty() && reasoning.empty() && calls.empty() && tokens.empty(); }
};

// A choice's reply, whole.
struct WholeReply {
  std::string text, reasoning;
  std::vector<ToolCall> calls;
  std::vector<TokenInfo> tokens;  // with logprobs only
};

// Adds generated text to the delta, through the choice's reply parser when it has one.
void add_text(Choice& c, Delta& d, const std::string& text, bool at_end) {
  if (!c.reply) {
    d.text += text;
    return;
  }
  ChatReplyDelta r = c.reply->push(text);
  if (at_end) {
    ChatReplyDelta e = c.reply->finish();
    r.reasoning += e.reasoning;
    r.content += e.content;
    for (ToolCall& t : e.calls) r.calls.push_back(std::move(t));
  }
  d.reasoning += r.reasoning;
  d.text += r.content;
  for (ToolCall& t : r.calls) d.calls.push_back(std::move(t));
}

// Moves the choice on by the events that are ready (waiting up to timeout_ms for the first),
// or by one token when `one_token` (a stream's chunk per token). Returns false when nothing
// happened.
bool pump(Choice& c, Delta& d, int timeout_ms, bool one_token = false) {
  bool any = false;
  while (!c.done) {
    std::optional<SequenceEvent> e = c.channel->pop(any ? 0 : timeout_ms);
    if (!e) break;
    any = true;
    if (e->kind == SequenceEvent::Kind::token) {
      if (c.latency && c.n_completion == 0) {
        c.latency->ttft.observe(std::chrono::duration<double>(e->time - c.arrival).count());
        if (e->admitted != Clock::time_point{})
          c.latency->queue.observe(std::max(0.0, std::chrono::duration<double>(e->admitted - c.arrival).count()));
      } else if (c.latency) {
        c.latency->itl.observe(std::chrono::duration<double>(e->time - c.last_token).count());
      }
      c.last_token = e->time;
      if (c.n_completion == 0) c.n_cached = e->n_cached;
      ++c.n_completion;
      if (e->logprob) d.tokens.push_back({e->token, *e->logprob, std::move(e->top_logprobs)});
      const bool keep = std::find(c.keep_ids.begin(), c.keep_ids.end(), e->token) != c.keep_ids.end();
      const std::string piece = keep ? c.decoder.flush() + c.tokenizer.decode(std::vector<int32_t>{e->token})
                                     : c.decoder.push(e->token);
      add_text(c, d, c.stop.push(piece), false);
      if (c.stop.stopped()) {
        add_text(c, d, "", true);
        c.done = true;
        c.finish_reason = "stop";
        c.channel->cancel();
      }
      if (one_token) break;
    } else if (e->kind == SequenceEvent::Kind::finished) {
      if (c.latency) c.latency->e2e.observe(std::chrono::duration<double>(e->time - c.arrival).count());
      c.n_cached = e->n_cached;
      c.n_drafted = e->n_drafted;
      c.n_accepted = e->n_accepted;
      std::string rest = c.stop.push(c.decoder.flush());
      rest += c.stop.flush();
      add_text(c, d, rest, true);
      c.done = true;
      c.finish_reason = e->finish_reason == "cancelled" ? "stop" : e->finish_reason;
    } else {
      c.done = true;
      c.error = e->error;
    }
  }
  return any;
}

// What streams a one-choice chat reply as another API's events: `begin` (optional) is sent at
// once, `step` for each step's output, `fail` for a sequence that failed (ending the stream),
// `end` once the reply is complete.
struct EventWriters {
  std::function<std::string()> begin;
  std::function<std::string(Choice&, const Delta&)> step;
  std::function<std::string(const ApiError&)> fail;
  std::function<std::string(Choice&)> end;
};

// Cancels every sequence of a request when the request goes (the client left or it ended).
struct CompletionState {
  CompletionRequest request;
  std::vector<std::unique_ptr<Choice>> choices;
  std::string id, model;
  int64_t created = 0;
  ~CompletionState() {
    for (auto& c : choices) c->channel->cancel();
  }
};

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  std::unique_ptr<HttpTransport> http;
  std::atomic<bool> ready{false};
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopped = false, finished = false;
  std::string device_lost;  // guarded by stop_mu: the engine's DeviceLost error
  Clock::time_point t_start = Clock::now();
  int64_t created = 0;
  std::string model_id;
  std::atomic<uint64_t> next_id{1};
  std::string id_prefix;
  HttpCounters http_counters;
  LatencyHistograms latency;
  // Generation requests read and not yet answered: running, queued in the engine, or waiting
  // for a generation thread. Admission keeps it at most n_slots + max_queue.
  std::atomic<int64_t> n_admitted{0};
  // Of those, the ones not yet on the engine's queue (waiting for a thread, or being read).
  std::atomic<int64_t> n_unsubmitted{0};
  std::atomic<uint64_t> n_refused_busy{0};

  // The tokenizer, chat template, tool-call and reasoning formats and sampling defaults.
  ModelBundle bundle;
  std::unique_ptr<Model> model;
  std::unique_ptr<Model> draft_model;  // --model-draft
  // The vision tower and image processor of a model that takes images (Gemma 3 with a
  // vision_config); run on the engine thread only.
  std::optional<ImageEncoder> image_encoder;
  // --prompt-cache-dir's folder: declared before the backend, which writes through it.
  std::unique_ptr<PromptStore> prompt_store;
  std::unique_ptr<PromptCache> prompt_cache;
  std::unique_ptr<SequenceBackend> backend;
  PagedBackend* paged = nullptr;  // backend, when the layout is paged
  CacheFiles* cache_files = nullptr;  // backend's prompt-cache files (the slot routes, the folder)
  bool set_invariant = false, invariant_before = false;
  std::unique_ptr<Scheduler> scheduler;
  std::vector<int32_t> eos_ids;
  std::shared_ptr<const grammar::TokenTrie> token_trie;  // the vocabulary, for constrained decoding
  // The automata of the last grammars requested, by GBNF text and end ids, most recent first:
  // a repeated schema finds its masks cached. Guarded by automata_mu; an automaton itself is
  // used on the engine thread only.
  std::mutex automata_mu;
  std::vector<std::pair<std::string, std::shared_ptr<grammar::Automaton>>> automata;
  bool think_model = false;                           // the template writes <think> blocks
  ResponseStore response_store{opt.response_store_entries, opt.response_store_bytes};  // /v1/responses
  // The pooling modules.json declares (model/pooling.h): /v1/embeddings answers with it; none,
  // or one Osprey refuses (pooling_error says why), and that route answers 400.
  std::optional<PoolingConfig> pooling;
  std::string pooling_error;

  explicit Impl(ServerOptions o) : opt(std::move(o)) {
    created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    model_id = !opt.alias.empty() ? opt.alias : std::filesystem::path(opt.model_dir).filename().string();
    if (model_id.empty()) model_id = std::filesystem::path(opt.model_dir).parent_path().filename().string();
    std::random_device rd;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08x", unsigned(rd()));
    id_prefix = buf;
    check_webui_options(opt.webui);
    http = std::make_unique<HttpTransport>(transport_options());
  }

  // "cmpl-<random><request id>": the number is the one the request's log line shows.
  std::string new_id(const char* kind) const { return std::string(kind) + "-" + id_prefix + std::to_string(t_log.id); }

  void require_ready() const {
    if (!ready) throw api_error(503, "unavailable_error", "the model is loading", "model_loading");
  }

  void check_model(const std::string& model) const {
    if (!model.empty() && model != model_id)
      throw api_error(404, "invalid_request_error", "the model '" + model + "' does not exist; this server serves '" +
                                                       model_id + "'",
                      "model_not_found");
  }

  // The index of the request's API key in opt.api_keys; -1 when it has none of them. The key
  // is Authorization's bearer token, else x-api-key's value (as Anthropic's clients send it).
  int key_index(const HttpRequest& req) const {
    std::string key = req.header("Authorization");
    if (key.rfind("Bearer ", 0) == 0)
      key = key.substr(7);
    else if (key.empty())
      key = req.header("x-api-key");
    int found = -1;
    for (size_t i = 0; i < opt.api_keys.size(); ++i)
      if (equal_constant_time(key, opt.api_keys[i]) && found < 0) found = int(i);
    return found;
  }

  bool authorized(const HttpRequest& req) const { return opt.api_keys.empty() || key_index(req) >= 0; }

  // The values a request's omitted sampling fields take, and where they come from.
  json sampling_json() const {
    auto r6 = [](float v) { return std::round(double(v) * 1e6) / 1e6; };
    const SamplerParams& p = bundle.sampling.params;
    return {{"temperature", r6(p.temperature)}, {"top_p", r6(p.top_p)},           {"top_k", p.top_k},
            {"min_p", r6(p.min_p)},             {"typical_p", r6(p.typical_p)},   {"repeat_penalty", r6(p.repetition_penalty)},
            {"source", bundle.sampling.source}};
  }

  json model_json() const {
    json m = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "osprey"}};
    if (ready)
      m["meta"] = {{"n_vocab", model->info().vocab_size},
                   {"n_ctx", backend->context_size()},
                   {"n_ctx_train", model->info().max_position_embeddings},
                   {"n_params", model->info().n_params},
                   {"input_modalities", image_encoder ? json::array({"text", "image"}) : json::array({"text"})},
                   {"sampling_defaults", sampling_json()}};
    return m;
  }

  // The prompt-cache salt of a request: its cache_salt field, under its API key's when the
  // server salts by key. Distinct (key, field) pairs give distinct salts.
  // A key is named by a digest of itself, not by its place in the list, so that the prompt
  // cache's files (which keep the salt) stay with their key across restarts.
  std::string cache_salt(const HttpRequest& req, const std::string& field) const {
    if (!opt.cache_salt_by_key || opt.api_keys.empty()) return field.empty() ? "" : "f:" + field;
    const int k = key_index(req);
    std::string key_id = "-1";
    if (k >= 0) {
      const std::string& key = opt.api_keys[size_t(k)];
      char buf[17];
      std::snprintf(buf, sizeof buf, "%016llx",
                    (unsigned long long)prompt_prefix_id(key, std::span<const int32_t>()));
      key_id = buf;
    }
    return "k" + key_id + (field.empty() ? "" : ":f:" + field);
  }

  void log_request(const HttpRequest& req, int status) {
    http_counters.count(route_label(req.path), status);
    const double ms = t_log.start == Clock::time_point{}
                          ? 0.0
                          : std::chrono::duration<double, std::milli>(Clock::now() - t_log.start).count();
    char buf[224];
    // drafted= and accepted= only for a request that drafted (speculative decoding).
    char drafts[64] = "";
    if (t_log.n_drafted > 0)
      std::snprintf(drafts, sizeof drafts, " drafted=%lld accepted=%lld", (long long)t_log.n_drafted,
                    (long long)t_log.n_accepted);
    std::snprintf(buf, sizeof buf, " %d prompt=%lld cached=%lld generated=%lld%s %.1fms", status,
                  (long long)t_log.n_prompt, (long long)t_log.n_cached, (long long)t_log.n_generated, drafts, ms);
    log_info("request " + std::to_string(t_log.id) + " [" + req.request_id + "]: " + req.method + " " +
             route_label(req.path) + buf);
    t_log = {};
  }

  // A route's handler with what every route shares: the API key, errors as OpenAI error
  // bodies, the count and the log line (for a stream, once it has ended).
  template <class F>
  HttpHandler wrap(F fn, bool open = false) {
    return [this, fn, open](HttpRequest& req) {
      t_log = {};
      t_log.start = Clock::now();
      t_log.id = next_id++;
      HttpResponse res;
      try {
        if (!open && !authorized(req))
          throw api_error(401, "authentication_error",
                          "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)", "invalid_api_key");
        res = fn(req);
      } catch (const ApiError& e) {
        res = error_response(req, e);
      } catch (const InvalidInput& e) {
        res = error_response(req, bad_request(e.what()));
      } catch (const Unsupported& e) {
        res = error_response(req, bad_request(e.what()));
      } catch (const std::exception& e) {
        log_warn("request " + std::to_string(t_log.id) + ": internal error: " + e.what());
        res = error_response(req, api_error(500, "server_error", std::string("internal error: ") + e.what()));
      }
      if (!res.stream) {
        log_request(req, res.status);
        return res;
      }
      auto log = t_log;
      res.stream = [this, &req, log, inner = std::move(res.stream), status = res.status](HttpStreamWriter& w) {
        t_log = log;
        inner(w);
        log_request(req, w.client_gone() ? 499 : status);
      };
      return res;
    };
  }

  // Generation routes: past n_slots + max_queue requests waiting or running, 429 at once
  // (on the IO thread, before the request takes a thread).
  std::optional<HttpResponse> admit(HttpRequest& req) {
    const int64_t limit = int64_t(opt.n_slots) + int64_t(opt.max_queue);
    if (n_admitted.fetch_add(1) < limit) {
      ++n_unsubmitted;
      return std::nullopt;
    }
    --n_admitted;
    ++n_refused_busy;
    HttpResponse r = error_response(
        req, api_error(429, "rate_limit_error",
                       "the server is busy: " + std::to_string(opt.max_queue) + " requests are already waiting",
                       "queue_full"));
    t_log = {};
    t_log.start = Clock::now();
    t_log.id = next_id++;
    log_request(req, 429);
    return r;
  }

  // The request on this thread has left the admission's waiting count.
  void submitted() {
    if (!t_unsubmitted) return;
    t_unsubmitted = false;
    --n_unsubmitted;
  }

  // Releases the admission of a generation request once its answer is complete.
  HttpHandler admitted(HttpHandler inner) {
    return [this, inner = std::move(inner)](HttpRequest& req) {
      // Its last copy (the handler's, or the stream's) releases the admission.
      std::shared_ptr<void> release(nullptr, [this](void*) { --n_admitted; });
      t_unsubmitted = true;
      HttpResponse res = inner(req);
      submitted();
      if (res.stream)
        res.stream = [release, s = std::move(res.stream)](HttpStreamWriter& w) { s(w); };
      return res;
    };
  }

  HttpTransportOptions transport_options() {
    HttpTransportOptions t;
    t.host = opt.host;
    t.port = opt.port;
    t.n_generate_threads = opt.n_http_threads > 0 ? opt.n_http_threads : 4 * opt.n_slots + 16;
    t.max_body_bytes = opt.max_body_bytes;
    t.header_timeout_s = opt.header_timeout_s;
    t.body_timeout_s = opt.timeout_s;
    t.write_timeout_s = opt.timeout_s;
    t.idle_timeout_s = opt.idle_timeout_s;
    t.max_requests_per_connection = opt.max_requests_per_connection;
    t.cors_origin = opt.cors_origin;
    t.error = [](const HttpRequest& req, int status, const std::string& message, const std::string& code) {
      return error_response(
          req, api_error(status, status == 404 ? "not_found_error" : "invalid_request_error", message, code));
    };
    t.on_transport_response = [this](const HttpRequest& req, int status) {
      t_log = {};
      t_log.start = Clock::now();
      t_log.id = next_id++;
      log_request(req, status);
    };
    t.route = [this](const HttpRequest& req) { return route(req); };
    return t;
  }

  // The route table. Each path takes one method; the others get 405.
  HttpRoute route(const HttpRequest& req) {
    const std::string& p = req.path;
    auto pick = [&](const char* method, HttpLane lane, HttpHandler h, bool admission = false) {
      HttpRoute r;
      if (req.method != method) {
        r.allowed = method;
        return r;
      }
      r.handler = std::move(h);
      r.lane = lane;
      if (admission) r.admit = [this](HttpRequest& q) { return admit(q); };
      return r;
    };
    // Answered on the IO threads: never queued behind generation.
    if (p == "/health") return pick("GET", HttpLane::io, health_);
    if (p == "/metrics") return pick("GET", HttpLane::io, metrics_);
    if (p == "/v1/models" || p == "/models") return pick("GET", HttpLane::io, models_);
    if (p.rfind("/v1/models/", 0) == 0 || p.rfind("/models/", 0) == 0) return pick("GET", HttpLane::io, one_model_);
    if (p == "/v1/completions" || p == "/completions") return pick("POST", HttpLane::generate, completions_, true);
    if (p == "/v1/chat/completions" || p == "/chat/completions") return pick("POST", HttpLane::generate, chat_, true);
    if (p == "/v1/messages") return pick("POST", HttpLane::generate, messages_, true);
    if (p == "/v1/messages/count_tokens") return pick("POST", HttpLane::work, count_tokens_);
    if (p == "/v1/responses") return pick("POST", HttpLane::generate, responses_, true);
    if (p.rfind("/v1/responses/", 0) == 0)
      return pick(req.method == "DELETE" ? "DELETE" : "GET", HttpLane::work, stored_response_);
    if (p == "/v1/embeddings" || p == "/embeddings") return pick("POST", HttpLane::generate, embeddings_, true);
    if (p == "/tokenize") return pick("POST", HttpLane::work, tokenize_);
    if (p == "/detokenize") return pick("POST", HttpLane::work, detokenize_);
    if (p == "/apply-template") return pick("POST", HttpLane::work, apply_template_);
    if (p.rfind("/slots/", 0) == 0) return pick("POST", HttpLane::work, slots_);
    // The chat page, and every other GET (server/webui.h answers 404 for what it does not
    // serve): from memory on the IO threads; from --webui-dir's files on a worker.
    if (req.method == "GET" || req.method == "HEAD")
      return pick(req.method.c_str(), opt.webui.dir.empty() ? HttpLane::io : HttpLane::work, webui_);
    return {};
  }

  ApiError device_lost_error() const {
    return api_error(503, "unavailable_error", "the device failed: " + scheduler->device_lost(), "device_lost");
  }

  HttpHandler health_ = wrap(
      [this](HttpRequest&) {
        if (ready && scheduler && !scheduler->device_lost().empty()) return error_response(device_lost_error());
        if (ready) return json_response(200, {{"status", "ok"}});
        return error_response(api_error(503, "unavailable_error", "the model is loading", "model_loading"));
      },
      /*open=*/true);
  HttpHandler models_ = wrap(
      [this](HttpRequest&) { return json_response(200, {{"object", "list"}, {"data", json::array({model_json()})}}); });
  HttpHandler one_model_ = wrap([this](HttpRequest& req) {
    const std::string id = req.path.substr(req.path.find("/models/") + 8);
    if (id != model_id)
      throw api_error(404, "invalid_request_error",
                      "the model '" + id + "' does not exist; this server serves '" + model_id + "'", "model_not_found");
    return json_response(200, model_json());
  });
  HttpHandler metrics_ = wrap([this](HttpRequest&) {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_text();
    return r;
  });
  HttpHandler completions_ = admitted(wrap([this](HttpRequest& req) { return complete(req, false); }));
  HttpHandler chat_ = admitted(wrap([this](HttpRequest& req) { return complete(req, true); }));
  HttpHandler messages_ = admitted(wrap([this](HttpRequest& req) { return messages(req); }));
  HttpHandler count_tokens_ = wrap([this](HttpRequest& req) { return count_tokens(req); });
  HttpHandler responses_ = admitted(wrap([this](HttpRequest& req) { return responses(req); }));
  HttpHandler stored_response_ = wrap([this](HttpRequest& req) { return stored_response(req); });
  HttpHandler embeddings_ = admitted(wrap([this](HttpRequest& req) { return embeddings(req); }));
  // The page asks for the API key itself: its own files need none, any other GET does.
  HttpHandler webui_ = wrap(
      [this](HttpRequest& req) {
        if (!is_webui_target(req.target, opt.webui) && !authorized(req))
          throw api_error(401, "authentication_error",
                          "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)", "invalid_api_key");
        WebUiResponse page =
            serve_webui({req.method, req.target, req.header("If-None-Match"), req.header("Accept-Encoding")}, opt.webui);
        HttpResponse r;
        r.status = page.status;
        r.body = std::move(page.body);
        for (auto& [name, value] : page.headers) {
          if (name == "Content-Type")
            r.content_type = std::move(value);
          else
            r.headers.emplace_back(std::move(name), std::move(value));
        }
        return r;
      },
      /*open=*/true);
  HttpHandler tokenize_ = wrap([this](HttpRequest& req) { return tokenize(req); });
  HttpHandler slots_ = wrap([this](HttpRequest& req) { return slot_action(req); });
  HttpHandler detokenize_ = wrap([this](HttpRequest& req) { return detokenize(req); });
  HttpHandler apply_template_ = wrap([this](HttpRequest& req) {
    require_ready();
    json body = parse_body(req.body);
    return json_response(200, {{"prompt", render_chat(body, req.body).text}});
  });

  // Renders a chat request's messages with the model's template. `raw` is the request body as
  // sent: it is read again with its keys in the client's order, so that `tojson` in a template
  // writes tools and arguments as transformers does. A message whose content is a list of text
  // parts reaches the template as one string, the parts joined by newlines (as OpenAI's
  // servers read it); templates written for strings would otherwise print a list. Tool-call
  // arguments sent as JSON strings reach it as objects (prepare_chat_messages).
  // Image parts are taken out first (server/image_parts.h): the template sees {"type": "image"}
  // in their place and writes each one's marker.
  struct ChatPrompt {
    std::string text;  // the rendered chat; each image's marker not yet expanded
    std::vector<RequestImage> images;  // their pixels moved into `views`
    ImageViews views;                  // each image, then its pan-and-scan crops
  };
  // `converted`: the request is another API's, made a chat request here (Anthropic, Responses):
  // its image parts carry their place in the request as sent ("at").
  ChatPrompt render_chat(const json& body, const std::string& raw, bool converted = false) {
    if (!body.is_object()) throw bad_request("the request body must be a JSON object");
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty())
      throw bad_request("'messages' is required and must be a non-empty array", "messages");
    if (!bundle.chat_template) throw bad_request("the model has no usable chat template: " + bundle.chat_template_error, "messages");
    nlohmann::ordered_json request = nlohmann::ordered_json::parse(raw);
    ChatPrompt out;
    ImagePartOptions io;
    io.converted = converted;
    if (!image_encoder)
      io.no_images = "this model takes text only (it has no vision tower" +
                     std::string(is_gguf_path(opt.model_dir) ? ": a GGUF file's is not read)" : ")");
    out.images = take_image_parts(request, io);
    if (!out.images.empty()) {  // refused above unless the model has a vision tower
      std::vector<RgbImage> pixels;
      std::vector<bool> cut;
      for (RequestImage& im : out.images) {
        pixels.push_back(std::move(im.pixels));
        cut.push_back(im.pan_and_scan.value_or(image_encoder->processor.do_pan_and_scan));
      }
      out.views = image_views(std::move(pixels), image_encoder->processor, cut);
    }
    prepare_chat_messages(request);
    try {
      out.text = bundle.chat_template->render(request);
      return out;
    } catch (const Unsupported& e) {
      throw bad_request(std::string("the chat template cannot render this request: ") + e.what(), "messages");
    } catch (const InvalidInput& e) {
      throw bad_request(e.what(), "messages");
    }
  }

  // A rendered chat's token ids, each image's marker expanded into its tokens (Gemma3Processor's
  // layout, vision/image_prompt.h), and where each image's tokens start. A prompt whose text
  // writes image tokens of its own is refused: they would take no image.
  std::vector<int32_t> chat_prompt_ids(const ChatPrompt& p, std::vector<int64_t>& image_starts) const {
    try {
      if (!image_encoder) return bundle.tokenizer->encode(p.text, /*add_special=*/false, /*parse_special=*/true);
      const VisionConfig& v = image_encoder->tower->config();
      const size_t n_views = p.views.views.size();
      const std::string text =
          p.images.empty() ? p.text : expand_image_markers(p.text, v, std::span<const size_t>(p.views.n_crops));
      std::vector<int32_t> ids = bundle.tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/true);
      image_starts = image_token_runs(ids, v);
      if (image_starts.size() != n_views)
        throw InvalidInput("the prompt holds the tokens of " + std::to_string(image_starts.size()) + " image(s) for " +
                           std::to_string(n_views) + " (the image parts and their pan-and-scan crops): a message's "
                           "text may not write image tokens");
      return ids;
    } catch (const InvalidInput& e) {
      throw bad_request(std::string("'messages': ") + e.what(), "messages");
    }
  }

  // The soft tokens of a chat prompt's images, encoded on the engine thread (the tower runs on
  // the model's device, between steps).
  std::vector<ImageSpan> encode_images(const std::vector<RgbImage>& pixels, const std::vector<int64_t>& starts) {
    std::vector<ImageSpan> spans;
    Scheduler::Submit s = Scheduler::Submit::stopping;
    try {
      s = scheduler->run_job([&] { spans = encode_prompt_images(*image_encoder, starts, pixels); });
    } catch (const DeviceLost&) {
      throw device_lost_error();
    }
    if (s == Scheduler::Submit::device_lost) throw device_lost_error();
    if (s != Scheduler::Submit::accepted)
      throw api_error(503, "unavailable_error", "the server is shutting down", "shutting_down");
    return spans;
  }

  HttpResponse tokenize(const HttpRequest& req) {
    require_ready();
    json body = parse_body(req.body);
    if (!body.is_object()) throw bad_request("the request body must be a JSON object");
    auto content = string_field(body, "content");
    if (!content) throw bad_request("'content' is required and must be a string", "content");
    const bool add_special = bool_field(body, "add_special").value_or(false);
    const bool parse_special = bool_field(body, "parse_special").value_or(true);
    const bool with_pieces = bool_field(body, "with_pieces").value_or(false);
    std::vector<int32_t> ids;
    try {
      ids = bundle.tokenizer->encode(*content, add_special, parse_special);
    } catch (const InvalidInput& e) {
      throw bad_request(std::string("'content': ") + e.what(), "content");
    }
    json tokens = json::array();
    for (int32_t id : ids) {
      if (!with_pieces) {
        tokens.push_back(id);
        continue;
      }
      const std::string piece = bundle.tokenizer->decode(std::vector<int32_t>{id});
      tokens.push_back({{"id", id}, {"piece", piece}});
    }
    return json_response(200, {{"tokens", tokens}});
  }

  HttpResponse detokenize(const HttpRequest& req) {
    require_ready();
    json body = parse_body(req.body);
    if (!body.is_object()) throw bad_request("the request body must be a JSON object");
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) throw bad_request("'tokens' is required and must be an array of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= bundle.tokenizer->vocab_size())
        throw bad_request("'tokens' must hold token ids in [0, " + std::to_string(bundle.tokenizer->vocab_size()) + ")", "tokens");
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    return json_response(200, {{"content", bundle.tokenizer->decode(ids)}});
  }

  // ---- completions ----

  json usage(const CompletionState& st) const {
    int64_t p = 0, c = 0, cached = 0;
    // A prompt counts once, with its first choice (n_prompt is 0 on the others).
    for (const auto& ch : st.choices) {
      p += ch->n_prompt;
      c += ch->n_completion;
      cached += ch->n_prompt > 0 ? ch->n_cached : 0;
    }
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  std::string piece(int32_t id) const { return bundle.tokenizer->decode(std::vector<int32_t>{id}); }

  static json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(int(ch));
    return b;
  }

  // Logprobs in the route's shape: chat {"content": [...]}, completions {"tokens", ...}.
  json logprobs_json(const std::vector<TokenInfo>& tokens, bool chat, size_t text_offset) const {
    if (chat) {
      json content = json::array();
      for (const TokenInfo& t : tokens) {
        const std::string s = piece(t.id);
        json top = json::array();
        for (const TokenLogprob& o : t.top) {
          const std::string os = piece(o.id);
          top.push_back({{"token", os}, {"logprob", o.logprob}, {"bytes", bytes_of(os)}});
        }
        content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
      }
      return {{"content", content}};
    }
    json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenInfo& t : tokens) {
      const std::string s = piece(t.id);
      toks.push_back(s);
      lps.push_back(t.logprob);
      json top = json::object();
      for (const TokenLogprob& o : t.top) top[piece(o.id)] = o.logprob;
      tops.push_back(top);
      offsets.push_back(text_offset);
      text_offset += s.size();
    }
    return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // "tool_calls" when a reply that ended by itself made calls (n_more: those not yet counted).
  static std::string finish_reason(const Choice& c, size_t n_more) {
    return c.finish_reason == "stop" && c.n_calls + n_more > 0 ? "tool_calls" : c.finish_reason;
  }

  json envelope(const CompletionState& st, bool chunk) const {
    const char* object = st.request.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return {{"id", st.id},
            {"object", object},
            {"created", st.created},
            {"model", st.model},
            {"system_fingerprint", opt.system_fingerprint}};
  }

  // Choice `index` of a request, with its reply parser when the route splits reasoning or tool
  // calls out of the text.
  std::unique_ptr<Choice> new_choice(const HttpRequest& req, const CompletionRequest& r, size_t index,
                                     bool prompt_opens_reasoning) {
    auto c = std::make_unique<Choice>(*bundle.tokenizer, r.stop);
    c->latency = &latency;
    c->arrival = req.received != Clock::time_point{} ? req.received : t_log.start;
    if (r.chat && (think_model || r.parse_tool_calls)) {
      std::optional<ReasoningParser> reasoning;
      if (think_model) reasoning.emplace(prompt_opens_reasoning);
      std::optional<ToolCallParser> tools;
      if (r.parse_tool_calls) {
        ToolCallParserOptions to;
        to.format = bundle.tool_format;
        to.functions = r.tool_names;
        to.parallel = r.parallel_tool_calls;
        to.stream_arguments = r.stream;
        to.id_prefix = r.tool_call_id_prefix + id_prefix + std::to_string(t_log.id) + "_" + std::to_string(index) + "_";
        tools.emplace(std::move(to));
        c->keep_ids = bundle.tool_marker_ids;
      }
      c->reply.emplace(std::move(reasoning), std::move(tools));
    }
    return c;
  }

  // The automaton of a request's grammar: a cached one for the same text, or a new one (kept
  // among the 16 most recent).
  std::shared_ptr<grammar::Automaton> automaton_for(RequestGrammar rg, bool ignore_eos) {
    const std::string key = std::string(ignore_eos ? "1" : "0") + rg.gbnf;
    std::lock_guard<std::mutex> lock(automata_mu);
    for (size_t i = 0; i < automata.size(); ++i)
      if (automata[i].first == key) {
        std::rotate(automata.begin(), automata.begin() + long(i), automata.begin() + long(i) + 1);
        return automata[0].second;
      }
    std::shared_ptr<grammar::Automaton> a;
    try {
      a = std::make_shared<grammar::Automaton>(std::move(rg.grammar), token_trie,
                                               ignore_eos ? std::vector<int32_t>{} : eos_ids);
    } catch (const InvalidInput& e) {
      throw bad_request("'" + rg.field + "': " + e.what(), rg.field);
    }
    automata.insert(automata.begin(), {key, a});
    if (automata.size() > 16) automata.pop_back();
    return a;
  }

  HttpResponse complete(const HttpRequest& req, bool chat) {
    require_ready();
    auto st = submit(req, parse_body(req.body), req.body, chat, Api::openai);
    if (st->request.stream) return stream(st);
    return respond(req, *st);
  }

  enum class Api { openai, anthropic };  // whose ids a request's reply carries

  // Reads a completion or chat request (`raw`: its body as sent, for the template's key
  // order), tokenizes its prompts and puts their sequences on the engine's queue.
  std::shared_ptr<CompletionState> submit(const HttpRequest& req, const json& body, const std::string& raw, bool chat,
                                          Api api, bool converted = false) {
    if (model->info().embedding_only)
      throw bad_request("this model is an embedding model (a bare " + model->info().model_type +
                            " base model with no lm_head): it answers POST /v1/embeddings, not generation",
                        "model", "model_not_generative");
    auto st = std::make_shared<CompletionState>();
    st->request = read_completion_fields(body, chat, bundle.sampling.params);
    CompletionRequest& r = st->request;
    check_model(r.model);
    st->model = model_id;
    st->id = api == Api::anthropic ? "msg_" + id_prefix + std::to_string(t_log.id) : new_id(chat ? "chatcmpl" : "cmpl");
    if (api == Api::anthropic) r.tool_call_id_prefix = "toolu_";
    st->created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const char* prompt_field = chat ? "messages" : "prompt";
    read_logit_bias(body, model->info().vocab_size, r.params.sampler);
    std::shared_ptr<grammar::Automaton> constraint;
    if (std::optional<RequestGrammar> rg = request_grammar(body, r.tool_choice, bundle.tool_format))
      constraint = automaton_for(std::move(*rg), r.ignore_eos);
    bool prompt_opens_reasoning = false;
    std::vector<RequestImage> images;  // the chat's images, in prompt order
    std::vector<RgbImage> views;       // what the tower sees of them (ImageViews)
    std::vector<int64_t> image_starts;
    if (chat) {
      if (r.parse_tool_calls && bundle.tool_format == ToolCallFormat::none)
        throw bad_request("'tools': this model's chat template has no tool-call format this server can parse (" +
                              std::string("known: Llama 3.x JSON, Hermes <tool_call>, Command R7B actions, Mistral "
                                          "[TOOL_CALLS]); send tool_choice \"none\" to render the tools without parsing "
                                          "calls"),
                          "tools");
      ChatPrompt chat_prompt = render_chat(body, raw, converted);
      prompt_opens_reasoning = prompt_opens_think(chat_prompt.text);
      r.prompts.push_back(chat_prompt_ids(chat_prompt, image_starts));
      images = std::move(chat_prompt.images);
      views = std::move(chat_prompt.views.views);
      if (r.prompts.back().empty()) throw bad_request("the rendered chat is empty", "messages");
    } else {
      auto it = body.find("prompt");
      if (it == body.end() || it->is_null()) throw bad_request("'prompt' is required", "prompt");
      r.prompts = read_prompts(*it, *bundle.tokenizer, model->info().vocab_size);
    }
    const int64_t ctx = backend->context_size();
    for (const auto& p : r.prompts) {
      if (int64_t(p.size()) >= ctx)
        throw bad_request("this model's context is " + std::to_string(ctx) + " tokens; the prompt has " +
                              std::to_string(p.size()),
                          prompt_field, "context_length_exceeded");
      t_log.n_prompt += int64_t(p.size());
    }
    if (r.n > backend->max_running())
      throw bad_request("'n' must be at most " + std::to_string(backend->max_running()) +
                            ", the sequences this server runs at once (-np)",
                        "n");
    // A cached prefix is reused only under the same images: their bytes join the salt.
    std::vector<std::string> image_bytes;
    for (const RequestImage& im : images) image_bytes.push_back(im.bytes);
    const std::vector<ImageSpan> spans = images.empty() ? std::vector<ImageSpan>() : encode_images(views, image_starts);
    // Submit every prompt, its n choices as one request whose prompt is computed once; a
    // refusal withdraws those already queued (CompletionState's destructor cancels them).
    for (const auto& p : r.prompts) {
      SequenceRequest sr;
      sr.id = t_log.id;
      sr.cache_salt = cache_salt(req, r.cache_salt) + image_cache_salt(image_bytes);
      sr.prompt = p;
      sr.images = spans;
      for (int64_t k = 0; k < r.n; ++k) {
        auto c = new_choice(req, r, st->choices.size(), prompt_opens_reasoning);
        c->n_prompt = k == 0 ? int64_t(p.size()) : 0;
        SequenceParams params = r.params;
        params.sampler.seed = choice_seed(r.params.sampler.seed, uint64_t(k));
        params.max_tokens = r.max_tokens.value_or(chat ? ctx : 16);
        if (!r.ignore_eos) params.stop_ids = eos_ids;
        params.grammar = constraint;
        if (k == 0) {
          sr.params = std::move(params);
          sr.channel = c->channel;
        } else {
          sr.forks.push_back({std::move(params), c->channel});
        }
        st->choices.push_back(std::move(c));
      }
      switch (scheduler->submit(std::move(sr))) {
        case Scheduler::Submit::accepted: break;
        case Scheduler::Submit::queue_full:
          throw api_error(429, "rate_limit_error",
                          "the server is busy: " + std::to_string(opt.max_queue) + " requests are already waiting",
                          "queue_full");
        case Scheduler::Submit::stopping:
          throw api_error(503, "unavailable_error", "the server is shutting down", "shutting_down");
        case Scheduler::Submit::device_lost:
          throw device_lost_error();
      }
    }
    submitted();
    return st;
  }

  // The error a failed sequence ends its request with.
  ApiError sequence_error(const std::string& error) const {
    if (error == "the server is shutting down")
      return api_error(503, "unavailable_error", error, "shutting_down");
    if (!scheduler->device_lost().empty()) return device_lost_error();
    return api_error(500, "server_error", error);
  }

  // Waits for choice c's whole reply and counts it in the log line. Returns false when the
  // client left first; throws the error of a failed sequence.
  bool collect(const HttpRequest& req, Choice& c, WholeReply& w) {
    while (!c.done) {
      Delta d;
      if (!pump(c, d, kPollMs)) {
        if (req.client_gone && req.client_gone()) return false;
        continue;
      }
      w.text += d.text;
      w.reasoning += d.reasoning;
      append_tool_call_pieces(w.calls, std::move(d.calls));
      for (auto& t : d.tokens) w.tokens.push_back(std::move(t));
    }
    t_log.n_cached += c.n_prompt > 0 ? c.n_cached : 0;
    t_log.n_generated += c.n_completion;
    t_log.n_drafted += c.n_drafted;
    t_log.n_accepted += c.n_accepted;
    if (!c.error.empty()) throw sequence_error(c.error);
    return true;
  }

  static HttpResponse client_left() {
    HttpResponse gone;
    gone.status = 499;  // nobody reads it; the log line shows the client left
    return gone;
  }

  HttpResponse respond(const HttpRequest& req, CompletionState& st) {
    json choices = json::array();
    for (size_t i = 0; i < st.choices.size(); ++i) {
      Choice& c = *st.choices[i];
      WholeReply w;
      if (!collect(req, c, w)) return client_left();
      json choice = {{"index", i}, {"finish_reason", finish_reason(c, w.calls.size())}};
      json lp = st.request.logprobs ? logprobs_json(w.tokens, st.request.chat, 0) : json(nullptr);
      if (st.request.chat)
        choice["message"] = chat_message_json(w.text, w.reasoning, w.calls);
      else
        choice["text"] = w.text;
      choice["logprobs"] = lp;
      choices.push_back(choice);
    }
    json out = envelope(st, false);
    out["choices"] = choices;
    out["usage"] = usage(st);
    return json_response(200, out);
  }

  HttpResponse stream(std::shared_ptr<CompletionState> st) {
    HttpResponse res;
    res.content_type = "text/event-stream";
    res.headers.emplace_back("Cache-Control", "no-cache");
    res.stream = [this, st](HttpStreamWriter& sink) {
      auto send = [&](const json& j) { return sink.write("data: " + dump(j) + "\n\n"); };
      const bool chat = st->request.chat;
      const size_t n = st->choices.size();
      if (chat)
        for (size_t i = 0; i < n; ++i) {
          json j = envelope(*st, true);
          j["choices"] = json::array(
              {{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
          if (!send(j)) return;
        }
      std::vector<size_t> offsets(n, 0);
      // Sends choice i's delta; false when the stream ends (the client left, or the choice
      // failed and its error was sent).
      auto forward = [&](size_t i, Delta& d) {
        Choice& c = *st->choices[i];
        if (c.n_prompt > 0) t_log.n_cached = c.n_cached;
        if (!c.error.empty()) {
          send(sequence_error(c.error).body());
          return false;
        }
        if (c.done) {
          t_log.n_generated += c.n_completion;
          t_log.n_drafted += c.n_drafted;
          t_log.n_accepted += c.n_accepted;
        }
        if (d.empty() && !c.done) return true;
        const json finish = c.done ? json(finish_reason(c, d.calls.size())) : json(nullptr);
        json lp = st->request.logprobs && !d.tokens.empty() ? logprobs_json(d.tokens, chat, offsets[i]) : json(nullptr);
        offsets[i] += d.text.size();
        std::vector<json> deltas =
            chat ? chat_stream_deltas({d.reasoning, d.text, d.calls}, c.n_calls) : std::vector<json>{};
        if (chat && deltas.empty()) deltas.push_back(json::object());
        const size_t n_chunks = chat ? deltas.size() : 1;
        for (size_t k = 0; k < n_chunks; ++k) {
          json choice = {{"index", i}, {"finish_reason", k + 1 == n_chunks ? finish : json(nullptr)}};
          if (chat)
            choice["delta"] = deltas[k];
          else
            choice["text"] = d.text;
          choice["logprobs"] = k == 0 ? lp : json(nullptr);
          json j = envelope(*st, true);
          j["choices"] = json::array({choice});
          if (!send(j)) return false;
        }
        return true;
      };
      // The choices decode in the same steps: each round forwards what every one has ready,
      // and an idle round waits on the first unfinished one.
      for (;;) {
        bool any = false, open = false;
        for (size_t i = 0; i < n; ++i) {
          if (st->choices[i]->done) continue;
          open = true;
          Delta d;
          if (!pump(*st->choices[i], d, 0, /*one_token=*/true)) continue;
          any = true;
          if (!forward(i, d)) return;
        }
        if (!open) break;
        if (any) continue;
        size_t i = 0;
        while (st->choices[i]->done) ++i;
        Delta d;
        if (!pump(*st->choices[i], d, kPollMs, /*one_token=*/true)) {
          if (sink.client_gone()) return;
          continue;
        }
        if (!forward(i, d)) return;
      }
      if (st->request.include_usage) {
        json j = envelope(*st, true);
        j["choices"] = json::array();
        j["usage"] = usage(*st);
        if (!send(j)) return;
      }
      sink.write("data: [DONE]\n\n");
    };
    return res;
  }

  // ---- Anthropic Messages (server/anthropic_api.h): a chat request in Anthropic's shapes ----

  HttpResponse messages(const HttpRequest& req) {
    require_ready();
    const std::string raw =
        read_anthropic_request(parse_body<nlohmann::ordered_json>(req.body), AnthropicRoute::messages).dump();
    auto st = submit(req, json::parse(raw), raw, /*chat=*/true, Api::anthropic, /*converted=*/true);
    if (st->request.stream) return messages_stream(st);
    Choice& c = *st->choices[0];
    WholeReply w;
    if (!collect(req, c, w)) return client_left();
    HttpResponse r;
    r.body = anthropic_message_json(st->id, st->model, w.text, w.reasoning, w.calls,
                                    anthropic_stop(*st, c, !w.calls.empty()), anthropic_usage(c))
                 .dump(-1, ' ', false, json::error_handler_t::replace);
    return r;
  }

  static AnthropicStop anthropic_stop(const CompletionState& st, const Choice& c, bool called) {
    AnthropicStop s;
    s.finish_reason = c.finish_reason;
    s.stop_sequence = c.stop.matched();
    s.context_full = c.finish_reason == "length" && c.n_completion < st.request.max_tokens.value_or(INT64_MAX);
    s.called = called;
    return s;
  }

  static AnthropicUsage anthropic_usage(const Choice& c) { return {c.n_prompt, c.n_cached, c.n_completion}; }

  // message_start once the first token is in (its usage then holds the prompt's cached
  // tokens), a block's events per token, an error event when the sequence fails.
  HttpResponse messages_stream(std::shared_ptr<CompletionState> st) {
    auto events = std::make_shared<AnthropicEventStream>(st->id, st->model);
    auto started = std::make_shared<bool>(false);
    auto start = [events, started](const Choice& c) {
      const bool first = !*started;
      *started = true;
      return first ? events->start(anthropic_usage(c)) : std::string();
    };
    EventWriters w;
    w.step = [events, start](Choice& c, const Delta& d) {
      for (const ToolCall& t : d.calls) c.n_calls += t.id.empty() ? 0 : 1;
      return start(c) + events->push(d.reasoning, d.text, d.calls);
    };
    w.fail = [](const ApiError& e) { return anthropic_event("error", anthropic_error_body(e)); };
    w.end = [st, events, start](Choice& c) {
      return start(c) + events->finish(anthropic_stop(*st, c, c.n_calls > 0), anthropic_usage(c));
    };
    return event_stream(st, std::move(w));
  }

  HttpResponse event_stream(std::shared_ptr<CompletionState> st, EventWriters w) {
    HttpResponse res;
    res.content_type = "text/event-stream";
    res.headers.emplace_back("Cache-Control", "no-cache");
    res.stream = [this, st, w = std::move(w)](HttpStreamWriter& sink) {
      Choice& c = *st->choices[0];
      if (w.begin && !sink.write(w.begin())) return;
      while (!c.done) {
        Delta d;
        if (!pump(c, d, kPollMs, /*one_token=*/true)) {
          if (sink.client_gone()) return;
          continue;
        }
        if (!c.error.empty()) {
          sink.write(w.fail(sequence_error(c.error)));
          return;
        }
        if (!sink.write(w.step(c, d))) return;
      }
      t_log.n_cached = c.n_cached;
      t_log.n_generated = c.n_completion;
      t_log.n_drafted = c.n_drafted;
      t_log.n_accepted = c.n_accepted;
      sink.write(w.end(c));
    };
    return res;
  }

  // ---- embeddings (server/embeddings.h) ----

  // Each input's forward runs as one job on the engine thread (Scheduler::run_job), one input
  // after another: running generations step between them.
  HttpResponse embeddings(const HttpRequest& req) {
    require_ready();
    const json body = parse_body(req.body);
    if (body.is_object()) check_model(string_field(body, "model").value_or(""));
    if (!pooling)
      throw bad_request(pooling_error.empty() ? "this model declares no pooling (modules.json): it is not an "
                                                "embedding model"
                                              : "this model's pooling declaration is not supported: " + pooling_error,
                        "model", "model_not_embedding");
    const EmbeddingRequest r = read_embedding_request(body, *bundle.tokenizer, model->info().vocab_size);
    const int64_t hidden = model->info().hidden_size;
    if (r.dimensions && *r.dimensions > hidden)
      throw bad_request("'dimensions' must be in [1, " + std::to_string(hidden) + "], this model's hidden size; got " +
                            std::to_string(*r.dimensions),
                        "dimensions");
    const int64_t ctx = backend->context_size();
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      if (int64_t(r.inputs[i].size()) > ctx)
        throw bad_request("this model's context is " + std::to_string(ctx) + " tokens; input " + std::to_string(i) +
                              " has " + std::to_string(r.inputs[i].size()),
                          "input", "context_length_exceeded");
      t_log.n_prompt += int64_t(r.inputs[i].size());
    }
    submitted();  // its jobs go to the engine now, not to the waiting count
    std::vector<std::vector<float>> out;
    for (const std::vector<int32_t>& ids : r.inputs) {
      if (req.client_gone && req.client_gone()) return client_left();
      std::vector<float> e;
      Scheduler::Submit s = Scheduler::Submit::stopping;
      try {
        s = scheduler->run_job([&] { e = embed_tokens(*model, ids, *pooling, opt.prefill_chunk); });
      } catch (const DeviceLost&) {
        throw device_lost_error();
      }
      if (s == Scheduler::Submit::device_lost) throw device_lost_error();
      if (s != Scheduler::Submit::accepted)
        throw api_error(503, "unavailable_error", "the server is shutting down", "shutting_down");
      if (r.dimensions) truncate_embedding(e, *r.dimensions, pooling->normalize);
      out.push_back(std::move(e));
    }
    return json_response(200, embedding_reply(out, r.base64, model_id, t_log.n_prompt));
  }

  // The prompt's tokens as the chat route would make them, tools included.
  HttpResponse count_tokens(const HttpRequest& req) {
    require_ready();
    const std::string raw =
        read_anthropic_request(parse_body<nlohmann::ordered_json>(req.body), AnthropicRoute::count_tokens).dump();
    const json body = json::parse(raw);
    check_model(read_completion_fields(body, /*chat=*/true).model);  // tools and tool_choice checked too
    std::vector<int64_t> image_starts;
    const std::vector<int32_t> ids = chat_prompt_ids(render_chat(body, raw, /*converted=*/true), image_starts);
    t_log.n_prompt = int64_t(ids.size());
    return json_response(200, {{"input_tokens", ids.size()}});
  }

  // ---- OpenAI Responses (server/responses_api.h): a chat request as a response's items ----

  HttpResponse responses(const HttpRequest& req) {
    require_ready();
    ResponsesRequest rr = read_responses_request(parse_body<nlohmann::ordered_json>(req.body));
    std::optional<StoredResponse> prev;
    if (!rr.previous_response_id.empty() && !(prev = response_store.get(store_key(req, rr.previous_response_id))))
      throw response_not_found(rr.previous_response_id, "previous_response_id");
    const nlohmann::ordered_json items = responses_conversation(rr, prev ? &*prev : nullptr);
    const std::string raw = responses_chat_request(rr, items).dump();
    auto st = submit(req, json::parse(raw), raw, /*chat=*/true, Api::openai, /*converted=*/true);
    st->id = "resp_" + id_prefix + std::to_string(t_log.id);
    auto r6 = [](float v) { return std::round(double(v) * 1e6) / 1e6; };
    rr.echo["temperature"] = r6(st->request.params.sampler.temperature);
    rr.echo["top_p"] = r6(st->request.params.sampler.top_p);
    auto reply = std::make_shared<ResponsesReply>(st->id, st->created, st->model, rr.echo, rr.reasoning_summary);
    if (rr.stream) {
      EventWriters ew;
      ew.begin = [reply] { return reply->start(); };
      ew.step = [reply](Choice&, const Delta& d) { return reply->push(d.reasoning, d.text, d.calls); };
      ew.fail = [reply](const ApiError& e) { return reply->error(e); };
      ew.end = [this, key = store_key(req, st->id), reply, items, store = rr.store](Choice& c) {
        return finish_response(key, c, *reply, items, store);
      };
      return event_stream(st, std::move(ew));
    }
    WholeReply w;
    if (!collect(req, *st->choices[0], w)) return client_left();
    reply->push(w.reasoning, w.text, w.calls);
    finish_response(store_key(req, st->id), *st->choices[0], *reply, items, rr.store);
    HttpResponse r;
    r.body = reply->response().dump(-1, ' ', false, json::error_handler_t::replace);
    return r;
  }

  // A response's key in the store: its id under the request's API key, so that a key sees only
  // the responses made with it.
  std::string store_key(const HttpRequest& req, const std::string& id) const {
    return std::to_string(key_index(req)) + "/" + id;
  }

  // The last events of a response; the response is kept (under `key`) for previous_response_id
  // and GET unless `store` is false.
  std::string finish_response(const std::string& key, const Choice& c, ResponsesReply& reply,
                              const nlohmann::ordered_json& items, bool store) {
    const std::string& reasoning = reply.reasoning();
    const int64_t n_reasoning = reasoning.empty() ? 0 : int64_t(bundle.tokenizer->encode(reasoning, false, false).size());
    std::string events = reply.finish(c.finish_reason == "length", {c.n_prompt, c.n_cached, c.n_completion, n_reasoning});
    if (store) response_store.put(key, {reply.response(), items});
    return events;
  }

  // GET (the stored response) and DELETE /v1/responses/{id}.
  HttpResponse stored_response(const HttpRequest& req) {
    const std::string id = req.path.substr(std::strlen("/v1/responses/"));
    if (req.method == "DELETE") {
      if (!response_store.erase(store_key(req, id))) throw response_not_found(id, "response_id");
      return json_response(200, {{"id", id}, {"object", "response"}, {"deleted", true}});
    }
    std::optional<StoredResponse> r = response_store.get(store_key(req, id));
    if (!r) throw response_not_found(id, "response_id");
    HttpResponse out;
    out.body = r->response.dump(-1, ' ', false, json::error_handler_t::replace);
    return out;
  }

  // ---- the slot routes: llama.cpp's POST /slots/{id}?action=save|restore|erase ----

  // Runs `job` on the engine thread (between steps), rethrowing what it throws.
  void on_engine(const std::function<void()>& job) {
    Scheduler::Submit s = Scheduler::Submit::stopping;
    try {
      s = scheduler->run_job(job);
    } catch (const DeviceLost&) {
      throw device_lost_error();
    }
    if (s == Scheduler::Submit::device_lost) throw device_lost_error();
    if (s != Scheduler::Submit::accepted)
      throw api_error(503, "unavailable_error", "the server is shutting down", "shutting_down");
  }

  HttpResponse slot_action(const HttpRequest& req) {
    require_ready();
    if (!prompt_store || !prompt_store->enabled() || !cache_files)
      throw api_error(501, "not_supported_error",
                      prompt_store ? "the prompt cache folder is not in use (see the server's log at start)"
                                   : "this server does not support slot actions: start it with --prompt-cache-dir DIR",
                      "not_supported");
    const std::string id_text = req.path.substr(std::strlen("/slots/"));
    const int n_ids = cache_files->n_slot_ids();
    int id = -1;
    if (!id_text.empty() && id_text.size() <= 6 && std::all_of(id_text.begin(), id_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      id = std::stoi(id_text);
    if (id < 0 || id >= n_ids)
      throw bad_request("slot id '" + id_text + "' is not in [0, " + std::to_string(n_ids) + ") (" +
                            (paged ? "the paged layout's sequence slots, --parallel" : "the dense layout's slots") + ")",
                        "id_slot");
    std::string action;
    const size_t q = req.target.find('?');
    if (q != std::string::npos) {
      const std::string query = req.target.substr(q + 1);
      for (size_t at = 0; at <= query.size();) {
        size_t amp = query.find('&', at);
        if (amp == std::string::npos) amp = query.size();
        const std::string kv = query.substr(at, amp - at);
        if (kv.rfind("action=", 0) == 0) action = kv.substr(7);
        at = amp + 1;
      }
    }
    const auto t0 = Clock::now();
    auto ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
    if (action == "erase") {
      int64_t n = 0;
      on_engine([&] { n = cache_files->erase_slot(id); });
      return json_response(200, {{"id_slot", id}, {"n_erased", n}});
    }
    if (action != "save" && action != "restore")
      throw bad_request("invalid action '" + action + "': use ?action=save, restore or erase", "action");
    const json body = parse_body(req.body);
    if (!body.is_object() || !body.contains("filename") || !body["filename"].is_string())
      throw bad_request("'filename' must be a string: a file name in the prompt cache folder", "filename");
    const std::string filename = body["filename"].get<std::string>();
    const std::filesystem::path path = prompt_store->user_path(filename);  // InvalidInput: 400
    if (action == "save") {
      std::optional<PromptFileData> data;
      on_engine([&] { data = cache_files->slot_file(id); });
      if (!data)
        throw bad_request("slot " + std::to_string(id) + " holds no cached prompt (no sequence ended there, or its "
                              "rows were evicted)",
                          "id_slot", "slot_empty");
      uint64_t written = 0;
      try {
        written = prompt_store->save(filename, *data);
      } catch (const IoError& e) {
        throw api_error(500, "server_error", e.what(), "io_error");
      }
      return json_response(200, {{"id_slot", id},
                                 {"filename", filename},
                                 {"n_saved", data->tokens.size()},
                                 {"n_written", written},
                                 {"timings", {{"save_ms", ms()}}}});
    }
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
      throw api_error(404, "not_found_error", "no file '" + filename + "' in the prompt cache folder", "file_not_found");
    PromptFileData data;
    try {
      data = prompt_store->load(filename);
    } catch (const IoError& e) {
      throw bad_request(e.what(), "filename", "unusable_file");
    } catch (const InvalidInput& e) {
      throw bad_request(e.what(), "filename", "unusable_file");
    }
    const uint64_t n_read = std::filesystem::file_size(path, ec);
    int64_t n = 0;
    on_engine([&] { n = cache_files->restore_slot(id, data); });
    return json_response(200, {{"id_slot", id},
                               {"filename", filename},
                               {"n_restored", n},
                               {"n_read", ec ? 0 : n_read},
                               {"timings", {{"restore_ms", ms()}}}});
  }

  std::string metrics_text() const {
    MetricsInput in;
    in.ready = ready;
    in.n_slots = opt.n_slots;
    in.uptime_seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    if (ready) {
      in.serve.scheduler = scheduler->stats();
      if (paged) {
        // The prefix cache is the prompt cache of the paged layout: entries are blocks.
        in.serve.prompt_cache = paged->prefix_stats();
        in.serve.pool = paged->pool_stats();
      } else {
        in.serve.prompt_cache = prompt_cache->stats();
      }
      if (prompt_store) in.serve.prompt_store = prompt_store->stats();
    }
    // Waiting requests: in the engine's queue, and admitted ones not yet there (waiting for a
    // generation thread).
    in.serve.scheduler.n_waiting += n_unsubmitted.load();
    in.http = http_counters.snapshot();
    in.latency = &latency;
    return render_metrics(in);
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { stop(); }

int Server::bind() { return impl_->opt.port = impl_->http->bind(); }

void Server::start() { impl_->http->start(); }

void Server::load() {
  Impl& m = *impl_;
  BundleOptions bo;
  bo.chat_template = true;
  bo.sampling_fallback = openai_sampling();
  bo.sampling_fallback_name = "OpenAI's defaults";
  m.bundle = load_model_bundle(m.opt.model_dir, bo);
  if (!m.bundle.tokenizer) m.bundle.tokenizer = load_model_tokenizer(m.opt.model_dir);  // names what is missing
  LoadOptions lo;
  lo.device = m.opt.device;
  m.model = load_model(m.opt.model_dir, lo);
  if (!is_gguf_path(m.opt.model_dir)) {
    m.image_encoder = load_image_encoder(m.opt.model_dir, lo);
    if (m.image_encoder && m.opt.pan_and_scan) m.image_encoder->processor.do_pan_and_scan = *m.opt.pan_and_scan;
    if (m.image_encoder)
      log_info("images: a vision tower of " + std::to_string(m.image_encoder->tower->config().mm_tokens_per_image) +
               " tokens per image; pan-and-scan " +
               (m.image_encoder->processor.do_pan_and_scan ? "on" : "off") + " (a part's detail \"high\" or \"low\" decides for its image)");
  }
  if (m.opt.pan_and_scan && !m.image_encoder)
    throw InvalidInput("--pan-and-scan: the model takes no images (it has no vision tower" +
                       std::string(is_gguf_path(m.opt.model_dir) ? ": a GGUF file's is not read)" : ")"));
  m.eos_ids = m.bundle.stop_ids(m.model->info().eos_ids);
  m.token_trie = grammar::TokenTrie::from_tokenizer(*m.bundle.tokenizer);
  if (!is_gguf_path(m.opt.model_dir)) {
    try {
      m.pooling = read_pooling_config(m.opt.model_dir);
      if (m.pooling && m.pooling->dimension != 0 && m.pooling->dimension != m.model->info().hidden_size)
        throw InvalidInput(m.pooling->source + ": word_embedding_dimension is " + std::to_string(m.pooling->dimension) +
                           ", but the model's hidden size is " + std::to_string(m.model->info().hidden_size));
    } catch (const Error& e) {
      m.pooling.reset();
      m.pooling_error = e.what();
      log_warn("embeddings are off: " + m.pooling_error);
    }
  }
  if (m.pooling)
    log_info(std::string("embeddings: ") + pooling_mode_name(m.pooling->mode) + " pooling" +
             (m.pooling->normalize ? ", normalized" : "") + " (modules.json)");
  m.think_model = m.opt.split_reasoning && m.bundle.reasoning == ReasoningFormat::think;
  if (!m.bundle.chat_template) log_warn("chat completions are off: " + m.bundle.chat_template_error);
  m.prompt_cache = std::make_unique<PromptCache>(
      m.opt.kv_layout == KVLayout::dense ? m.opt.prompt_cache_mib << 20 : 0, m.opt.keep_prompt_cache_checksums);
  if (m.opt.spec.enabled()) {
    validate(m.opt.spec);
    if (!m.opt.spec.model_draft.empty())
      m.draft_model = load_draft_model(m.opt.spec.model_draft, *m.model,
                                       m.bundle.tokenizer ? &*m.bundle.tokenizer : nullptr, lo);
  }
  // NOTE: the mode is process-wide; the server sets it for its lifetime and puts it back.
  m.invariant_before = ops::batch_invariant();
  m.set_invariant = true;
  ops::set_batch_invariant(m.opt.batch_invariant);
  if (m.opt.kv_layout == KVLayout::paged) {
    PagedBackendOptions po;
    po.max_sequences = m.opt.n_slots;
    po.context_size = m.opt.ctx_size;
    po.block_size = m.opt.block_size;
    po.kv_cache_bytes = m.opt.kv_cache_mib << 20;
    po.prefix_cache = m.opt.prompt_cache_mib > 0;
    po.graphs = m.opt.graphs;
    po.device_sampling = env_options().cuda_sample_rows;
    po.split_keys = env_options().paged_split_keys;
    po.inplace = m.opt.cache.inplace;
    po.prefill_chunk = m.opt.prefill_chunk;
    if (m.opt.spec.enabled()) po.verify_rows = int64_t(m.opt.spec.draft_max) + 1;
    po.k_type = m.opt.cache.k_type;
    po.v_type = m.opt.cache.v_type;
    auto b = std::make_unique<PagedBackend>(*m.model, po);
    m.paged = b.get();
    m.cache_files = b.get();
    m.backend = std::move(b);
  } else {
    // The dense layout keeps a windowed model's layers in rotating caches, which cannot give a
    // verify's rejected rows back: refused here rather than serving without drafts.
    if (m.opt.spec.enabled() && !m.model->make_cache(m.opt.cache).gives_back_rows())
      throw InvalidInput(std::string(m.opt.spec.flag()) +
                         " with --kv-layout dense: the model has sliding-window layers, whose rotating KV cache "
                         "cannot give drafted rows back; the paged layout (the default) drafts for it");
    DenseBackendOptions bo;
    bo.n_slots = m.opt.n_slots;
    bo.context_size = m.opt.ctx_size;
    bo.cache = m.opt.cache;
    bo.make_cache = m.opt.make_cache;
    bo.graphs = m.opt.graphs;
    auto b = std::make_unique<DenseSlotBackend>(*m.model, *m.prompt_cache, bo);
    m.cache_files = b.get();
    m.backend = std::move(b);
  }
  if (!m.opt.prompt_cache_dir.empty()) {
    const auto t0 = Clock::now();
    PromptStoreOptions ps;
    ps.dir = m.opt.prompt_cache_dir;
    ps.kind = m.paged ? PromptFileKind::paged : PromptFileKind::dense;
    ps.max_bytes = m.opt.prompt_cache_max_bytes;
    ps.layers = model_kv_layers(*m.model, m.opt.cache);
    ps.block_size = m.paged ? m.opt.block_size : 0;
    ps.fingerprint = model_fingerprint(m.opt.model_dir, m.model->info().device);
    ps.fingerprint.kv = kv_layout_fingerprint(ps.kind, ps.layers, ps.block_size);
    ps.write = m.opt.prompt_cache_write;
    m.prompt_store = std::make_unique<PromptStore>(std::move(ps));
    m.cache_files->attach_store(*m.prompt_store);
    log_info("prompt cache folder " + m.opt.prompt_cache_dir.string() + ": " +
             (m.prompt_store->enabled() ? "in use" : "not in use") + " (" +
             std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s to open and restore)");
  }
  SchedulerOptions so;
  so.max_queue = m.opt.max_queue;
  so.prefill_chunk = m.opt.prefill_chunk;
  so.spec = m.opt.spec;
  so.draft_model = m.draft_model.get();
  so.draft_cache = m.opt.cache;
  so.draft_graphs = m.opt.graphs;
  so.on_device_lost = [&m](const std::string& error) {
    {
      std::lock_guard<std::mutex> lock(m.stop_mu);
      m.device_lost = error;
    }
    m.stop_cv.notify_all();
  };
  m.scheduler = std::make_unique<Scheduler>(*m.backend, so);
  m.ready = true;
  log_info("serving " + m.model_id + " on http://" + m.opt.host + ":" + std::to_string(m.opt.port) + " (" +
           std::to_string(m.opt.n_slots) + (m.paged ? " sequences batched" : " slots") + ", context " +
           std::to_string(m.backend->context_size()) + "; sampling defaults: " + m.bundle.sampling.source + ")");
}

void Server::drain(int timeout_ms) {
  Impl& m = *impl_;
  m.http->stop_accepting();
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline && (m.http->n_in_flight() > 0 || m.n_admitted > 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void Server::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.stop_mu);
    if (m.stopped) return;
    m.stopped = true;
  }
  m.http->stop_accepting();
  if (m.scheduler) m.scheduler->stop();
  // What the engine handed the prompt cache folder's writer is written before the process goes.
  if (m.prompt_store) m.prompt_store->close(std::chrono::seconds(30));
  // The requests the engine ended write their error; a client that does not read it within
  // the write deadline loses it.
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < deadline && m.http->n_in_flight() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.http->stop();
  if (m.set_invariant) ops::set_batch_invariant(m.invariant_before);
  {
    std::lock_guard<std::mutex> lock(m.stop_mu);
    m.ready = false;
    m.finished = true;
  }
  m.stop_cv.notify_all();
}

void Server::wait() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.stop_mu);
  m.stop_cv.wait(lock, [&] { return m.finished || !m.device_lost.empty(); });
}

std::string Server::device_lost() const {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  return impl_->device_lost;
}

std::string Server::metrics_text() const { return impl_->metrics_text(); }

void Server::flush_prompt_cache_dir() {
  if (impl_->prompt_store) impl_->prompt_store->flush();
}

std::vector<PromptCache::Checksum> Server::prompt_cache_checksums() {
  Impl& m = *impl_;
  if (!m.ready) throw InvalidInput("the server has no model loaded");
  std::vector<PromptCache::Checksum> out;
  m.scheduler->run_on_engine([&] { out = m.prompt_cache->checksums(); });
  return out;
}

}  // namespace osprey
