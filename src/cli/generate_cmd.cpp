#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/cpu_isa.h"
#include "backend/cuda_available.h"
#include "backend/device_select.h"
#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "core/env.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generation_config.h"
#include "serve/generate.h"
#include "serve/session_file.h"
#include "engine/sharded_model.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "model/model.h"
#include "chat/stop_matcher.h"
#include "tokenizer/tokenizer.h"
#include "bundle/model_bundle.h"
#include "bundle/model_files.h"
#include "serve/draft_model.h"
#include "formats/config_reader.h"
#include "vision/image_decode.h"
#include "vision/image_prompt.h"
#include "vision/vision_tower.h"

namespace osprey::cli {
namespace fs = std::filesystem;

std::string default_model_dir() {
  const fs::path dir = OSPREY_DEFAULT_MODEL_DIR;
  if (!fs::exists(dir / "config.json"))
    throw IoError("the embedded default model is missing at " + dir.string() +
                  ": run scripts/setup.sh to make it, or pass -m DIR");
  return dir.string();
}

// The folder's name, as the banner and the server's model id show it ("models/demo/" -> "demo").
std::string model_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

namespace {

// What runs the model, in a few words: "NVIDIA H200, 139 GiB" (cuda:N) or "CPU, 8 threads,
// AVX2"; says so when a CUDA build found no device and took the CPU without being asked to.
std::string device_words(const Device& device, const std::string& asked, int tensor_parallel) {
  std::string out;
  if (device.is_cpu()) {
    out = "CPU";
    if (asked.empty() && cuda_built()) out += " (no CUDA device found)";
    out += ", " + std::to_string(cpu_pool().n_threads()) + " threads, " + cpu_isa_name();
  } else {
    std::string gpu = cuda_description(device.index);
    gpu = gpu.substr(0, gpu.find(", driver"));
    out = device.str() + " " + gpu;
  }
  if (tensor_parallel > 1) out += ", " + std::to_string(tensor_parallel) + " tensor-parallel ranks";
  return out;
}

}  // namespace

void print_banner(const std::string& dir, const Device& device, const std::string& asked, int tensor_parallel,
                  int64_t context) {
  std::fprintf(stderr, "osprey: %s | %s | context %lld tokens\n", model_name(dir).c_str(),
               device_words(device, asked, tensor_parallel).c_str(), (long long)context);
}

namespace {

struct GenerateOptions {
  std::string model;
  bool download = false;
  std::optional<std::string> prompt;
  std::string prompt_file;
  std::string token_ids;
  std::optional<std::string> system;  // --system, with --chat
  std::vector<std::string> stops;
  std::string grammar_file;  // --grammar-file: GBNF
  std::string json_schema;   // --json-schema: the schema, or @file
  int n_predict = 128;
  int64_t ctx_size = 0;  // 0: the model's max_position_embeddings
  SamplerParams sampler;
  std::vector<std::string> sampler_flags;  // the sampler flags given (the others: the model's defaults)
  SpeculativeParams spec;
  bool json = false;
  bool verbose = false;
  bool ignore_eos = false;
  bool chat = false;
  bool quiet = false;
  int threads = -1;
  std::string device;
  std::string cache_type_k, cache_type_v;  // --cache-type-k, --cache-type-v
  int tensor_parallel = 1;
  std::string prompt_cache;  // --prompt-cache FILE
  std::vector<std::string> images;  // --image FILE (repeatable)
  std::optional<bool> pan_and_scan;  // --pan-and-scan / --no-pan-and-scan
};

// -f PATH: the whole file ("-": stdin), less one final newline (which editors add).
std::string read_prompt_file(const std::string& path) {
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (std::cin.bad()) throw IoError("-f -: cannot read the prompt from stdin");
  } else {
    if (fs::is_directory(path)) throw IoError("-f " + path + ": is a directory, not a file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError("-f " + path + ": cannot open: " + std::strerror(errno));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw IoError("-f " + path + ": read failed");
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  return text;
}

std::vector<int32_t> parse_token_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    char* end = nullptr;
    long v = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      throw UsageError("--token-ids: \"" + item + "\" is not a non-negative integer");
    ids.push_back(int32_t(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

struct PromptImages {
  VisionConfig vision;
  ImageViews views;
};

// The prompt's token ids: the text (-p, -f) as a one-turn chat through the folder's template
// (--chat, with --system), or encoded with BOS as the post-processor adds it; else --token-ids.
// With images (--image, `vision` set): --chat sends them as image parts before the text, whose
// markers the template writes; -p/-f text holds a marker where each goes; each marker is then
// expanded as Gemma3Processor does (vision/image_prompt.h), an image with crops followed by
// theirs. --token-ids hold the image tokens (a run for each image and each crop).
std::vector<int32_t> prompt_tokens(const GenerateOptions& o, const std::string& dir,
                                   const std::optional<std::string>& text, const Tokenizer* tokenizer,
                                   const PromptImages* images) {
  const size_t n_images = o.images.size();
  if (o.chat) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (o.system) messages.push_back({{"role", "system"}, {"content", *o.system}});
    if (n_images == 0) {
      messages.push_back({{"role", "user"}, {"content", *text}});
    } else {
      nlohmann::ordered_json parts = nlohmann::ordered_json::array();
      for (size_t i = 0; i < n_images; ++i) parts.push_back({{"type", "image"}});
      parts.push_back({{"type", "text"}, {"text", *text}});
      messages.push_back({{"role", "user"}, {"content", parts}});
    }
    // The template writes BOS itself: no second one from the post-processor.
    nlohmann::ordered_json request = {{"messages", messages}, {"add_generation_prompt", true}};
    std::string rendered = load_model_chat_template(dir).render(request);
    if (n_images > 0) rendered = expand_image_markers(rendered, images->vision, std::span<const size_t>(images->views.n_crops));
    return tokenizer->encode(rendered, false);
  }
  if (text)
    return tokenizer->encode(
        n_images > 0 ? expand_image_markers(*text, images->vision, std::span<const size_t>(images->views.n_crops)) : *text,
        true);
  return parse_token_ids(o.token_ids);
}

// --image files, read and decoded (errors name the flag and the file), and what the tower
// sees of them: each image, then its pan-and-scan crops (--pan-and-scan, or the processor's
// do_pan_and_scan).
std::optional<PromptImages> read_images(const GenerateOptions& o, const std::string& dir) {
  if (o.images.empty()) return std::nullopt;
  if (o.tensor_parallel > 1) throw UsageError("generate --image: not with --tensor-parallel");
  if (!o.prompt_cache.empty())
    throw UsageError("generate --image: not with --prompt-cache (its file is keyed by tokens alone, not images)");
  const ConfigReader c = ConfigReader::load(fs::path(dir) / "config.json");
  std::optional<VisionConfig> vision;
  if (c.get_string("model_type", "") == "gemma3") vision = parse_gemma3_vision_config(c);
  if (!vision)
    throw Unsupported("--image: " + model_name(dir) + " takes no image input (a text-only model: its config.json has "
                      "model_type \"" + c.get_string("model_type", "") + "\" and no vision_config)");
  std::vector<RgbImage> decoded;
  for (const std::string& file : o.images) {
    if (fs::is_directory(file)) throw IoError("--image " + file + ": is a directory, not a file");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw IoError("--image " + file + ": cannot open: " + std::strerror(errno));
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      decoded.push_back(decode_image(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
    } catch (const Unsupported& e) {
      throw Unsupported("--image " + file + ": " + e.what());
    } catch (const InvalidInput& e) {
      throw InvalidInput("--image " + file + ": " + e.what());
    }
  }
  ImageProcessorConfig processor = load_image_processor_config(dir, vision->image_size);
  if (o.pan_and_scan) processor.do_pan_and_scan = *o.pan_and_scan;
  return PromptImages{*vision, image_views(std::move(decoded), processor)};
}

// The KV cache's key and value types and bytes: the rows it holds (a sliding-window layer at most
// its ring) and its buffers, over all layers.
nlohmann::json kv_cache_json(const SequenceCache& cache) {
  uint64_t live = 0, held = 0;
  std::string type_k, type_v;
  for (const KVState& st : cache.snapshot()) {
    if (!st.keys.defined()) continue;
    if (type_k.empty()) {
      type_k = kv_cache_type_name(st.keys.dtype());
      type_v = kv_cache_type_name(st.values.dtype());
    }
    const int64_t rows = std::min(st.offset, st.keys.dim(1));
    for (const Array* a : {&st.keys, &st.values}) {
      live += uint64_t(a->nbytes() / size_t(a->dim(1))) * uint64_t(rows);
      held += a->nbytes();
    }
  }
  return {{"type_k", type_k}, {"type_v", type_v}, {"bytes", live}, {"buffer_bytes", held}};
}

// --json: one line with the prompt, the reply's tokens and text, the stop reason, the seed,
// the timings and the KV cache's types and bytes.
void print_json(const std::vector<int32_t>& prompt, const GenerateResult& r, const std::string& reply, uint64_t seed,
                const SessionRestore& cached, const SequenceCache& cache) {
  const GenerateStats& s = r.stats;
  nlohmann::json j;
  j["prompt_tokens"] = prompt;
  j["cached_tokens"] = cached.n_cached;
  j["tokens"] = r.tokens;
  j["text"] = reply;
  j["stop_reason"] = s.stop_reason;
  j["seed"] = seed;
  j["timings"] = {{"prompt_n", s.n_prompt},
                  {"prompt_ms", s.prompt_seconds * 1e3},
                  {"prompt_per_second", s.prompt_tps()},
                  {"predicted_n", s.n_generated},
                  {"predicted_ms", s.decode_seconds * 1e3},
                  {"predicted_per_second", s.decode_tps()},
                  {"kv_inplace_writes", s.kv.n_inplace_writes},
                  {"kv_copying_writes", s.kv.n_copying_writes},
                  {"kv_bytes_copied", s.kv.bytes_copied},
                  {"device_sampling", s.device_sampling},
                  {"pipelined", s.pipelined},
                  {"graph_replays", s.n_graph_replays},
                  {"graph_captures", s.n_graph_captures},
                  {"drafted_n", s.n_drafted},
                  {"accepted_n", s.n_accepted},
                  {"verify_steps", s.n_verify_steps},
                  {"draft_stops", s.n_draft_stops},
                  {"acceptance", s.acceptance()},
                  {"cache_n", cached.n_cached},
                  {"cache_restore_ms", cached.seconds * 1e3},
                  {"cache_read_bytes", cached.bytes_read}};
  j["kv_cache"] = kv_cache_json(cache);
  std::string out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::printf("%s\n", out.c_str());
}

// -c checked against the model's context and the prompt: the context the run has.
int64_t checked_context(const GenerateOptions& o, const Model& model, size_t prompt_size) {
  const int64_t max_ctx = model.info().max_position_embeddings;
  if (o.ctx_size > 0 && max_ctx > 0 && o.ctx_size > max_ctx)
    throw UsageError("-c/--ctx-size " + std::to_string(o.ctx_size) + " exceeds the model's context of " +
                     std::to_string(max_ctx) + " tokens (max_position_embeddings in config.json)");
  const int64_t ctx = o.ctx_size > 0 ? o.ctx_size : max_ctx;
  if (ctx > 0 && int64_t(prompt_size) > ctx)
    throw InvalidInput("the prompt (" + std::to_string(prompt_size) + " tokens) exceeds the context of " +
                       std::to_string(ctx) + " tokens" + (o.ctx_size > 0 ? " (-c)" : ""));
  return ctx;
}

// The engine's parameters from the flags and the model's bundle: length, sampler (a flag left
// out takes generation_config.json's value, else the flag's default), stop ids and grammar.
GenerateParams flag_params(const GenerateOptions& o, const ModelBundle& bundle, const Model& model, int64_t ctx,
                           size_t prompt_size) {
  GenerateParams gp = generate_params(env_options());
  gp.max_tokens = o.n_predict;
  // Prompt and reply together fit in -c (the engine itself stops at the model's context).
  if (o.ctx_size > 0) gp.max_tokens = int(std::min<int64_t>(o.n_predict, ctx - int64_t(prompt_size)));
  const SamplingDefaults& sd = bundle.sampling;
  gp.sampler = o.sampler;
  fill_unset_sampler_fields(gp.sampler, sd.params, o.sampler_flags);
  if (!o.quiet && sd.source != "the flags' defaults") std::fprintf(stderr, "sampling defaults: %s\n", sd.source.c_str());
  if (!o.ignore_eos) gp.stop_ids = bundle.stop_ids(model.info().eos_ids);
  if (!o.grammar_file.empty() || !o.json_schema.empty()) {
    if (!bundle.tokenizer) throw UsageError("generate --grammar-file/--json-schema: needs the model's tokenizer.json");
    gp.grammar = std::make_shared<grammar::Automaton>(read_grammar_flags("generate", o.grammar_file, o.json_schema),
                                                      grammar::TokenTrie::from_tokenizer(*bundle.tokenizer), gp.stop_ids);
  }
  validate(gp.sampler);
  gp.spec = o.spec;
  return gp;
}

// The reply's text as it streams: it passes through the stop strings (what precedes one is
// printed, or with --json kept; the stop string and what follows are not).
class ReplyText {
 public:
  ReplyText(const GenerateOptions& o, const std::optional<Tokenizer>& tokenizer) : json_(o.json), stop_(o.stops) {
    if (tokenizer) stream_.emplace(*tokenizer);
  }
  // False once a stop string ended the reply.
  bool push(int32_t token) {
    if (stream_) emit(stop_.push(stream_->push(token)));
    return !stop_.stopped();
  }
  void finish() {
    if (!stream_) return;
    emit(stop_.push(stream_->flush()));
    emit(stop_.flush());
    if (!json_) {
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
  }
  bool stopped() const { return stop_.stopped(); }
  const std::string& text() const { return reply_; }

 private:
  void emit(const std::string& piece) {
    if (json_) {
      reply_ += piece;
    } else if (!piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  }

  bool json_;
  std::optional<Tokenizer::StreamDecoder> stream_;
  StopMatcher stop_;
  std::string reply_;
};

// The run's summary on stderr (not with -q).
void print_summary(const GenerateOptions& o, const GenerateParams& gp, const GenerateStats& s,
                   const SessionRestore& cached, bool prompt_cache, size_t prompt_size) {
  if (o.quiet) return;
  if (prompt_cache)
    std::fprintf(stderr, "prompt cache: %lld of %zu prompt tokens restored from %s (%.1f ms)\n",
                 (long long)cached.n_cached, prompt_size, o.prompt_cache.c_str(), cached.seconds * 1e3);
  std::fprintf(stderr, "prompt: %lld tokens, %.1f t/s | decode: %lld tokens, %.1f t/s | kv writes: %llu in place, %llu copying\n",
               (long long)s.n_prompt, s.prompt_tps(), (long long)s.n_generated, s.decode_tps(),
               (unsigned long long)s.kv.n_inplace_writes, (unsigned long long)s.kv.n_copying_writes);
  if (gp.spec.enabled())
    std::fprintf(stderr, "speculative: %lld drafted, %lld accepted (%.1f%%) in %lld verify steps, %lld draft stops\n",
                 (long long)s.n_drafted, (long long)s.n_accepted, 100.0 * s.acceptance(), (long long)s.n_verify_steps,
                 (long long)s.n_draft_stops);
}

int run_generate(const GenerateOptions& o) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  const std::string dir = model_folder(o.model, o.download);
  if (!fs::exists(dir)) throw IoError("model folder " + dir + " does not exist");

  std::optional<std::string> text = o.prompt;
  if (!o.prompt_file.empty()) text = read_prompt_file(o.prompt_file);
  // A flag left out takes generation_config.json's value, else the flag's default.
  BundleOptions bo;
  bo.sampling_fallback = o.sampler;
  bo.sampling_fallback_name = "the flags' defaults";
  ModelBundle bundle = load_model_bundle(dir, bo);
  if (text && !bundle.tokenizer) bundle.tokenizer = load_model_tokenizer(dir);  // names what is missing
  std::optional<Tokenizer>& tokenizer = bundle.tokenizer;
  if (!o.stops.empty() && !tokenizer)
    throw UsageError("generate --stop: needs the model's tokenizer.json to read the reply's text");
  const std::optional<PromptImages> images = read_images(o, dir);
  const std::vector<int32_t> prompt =
      prompt_tokens(o, dir, text, tokenizer ? &*tokenizer : nullptr, images ? &*images : nullptr);
  std::vector<int64_t> image_starts;
  if (images) {
    image_starts = image_token_runs(prompt, images->vision);
    if (image_starts.size() != images->views.views.size())
      throw UsageError("generate --image: the prompt holds the tokens of " + std::to_string(image_starts.size()) +
                       " image(s) for " + std::to_string(o.images.size()) + " --image file(s)" +
                       (images->views.views.size() > o.images.size()
                            ? " and their " + std::to_string(images->views.views.size() - o.images.size()) +
                                  " pan-and-scan crop(s)"
                            : ""));
  }

  const std::string asked_device = o.device.empty() ? env_options().device : o.device;
  std::unique_ptr<Model> model;
  std::optional<ImageEncoder> encoder;
  {
    ProgressBar bar("loading " + model_name(dir));
    LoadOptions lo;
    lo.device = select_device(asked_device);
    lo.progress = [&](size_t done, size_t total) { bar.update(done, total); };
    model = load_sharded_model(dir, o.tensor_parallel, lo);
    if (images) {
      lo.progress = nullptr;
      encoder = load_image_encoder(dir, lo);
      if (!encoder) throw Unsupported("--image: " + model_name(dir) + " has no vision tower to load");
    }
  }
  const int64_t ctx = checked_context(o, *model, prompt.size());
  if (!o.quiet) print_banner(dir, model->info().device, asked_device, o.tensor_parallel, ctx);

  GenerateParams gp = flag_params(o, bundle, *model, ctx, prompt.size());
  std::unique_ptr<Model> draft = load_draft_model(o.spec, *model, tokenizer ? &*tokenizer : nullptr, model->info().device, o.quiet);
  gp.draft_model = draft.get();
  if (o.verbose) std::fprintf(stderr, "seed: %llu\n", (unsigned long long)gp.sampler.seed);
  if (images) {
    const auto t_images = std::chrono::steady_clock::now();
    gp.images = encode_prompt_images(*encoder, image_starts, images->views.views);
    if (!o.quiet)
      std::fprintf(stderr, "images: %zu encoded in %.1f ms\n", gp.images.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t_images).count() * 1e3);
  }

  const EnvOptions& env = env_options();
  KVCacheParams co;
  co.step = env.kv_step;
  co.inplace = env.kv_inplace_write;
  co.k_type = cache_type(o.cache_type_k, "--cache-type-k");
  co.v_type = cache_type(o.cache_type_v, "--cache-type-v");
  SequenceCache cache = model->make_cache(co);
  // --prompt-cache: the prompt's longest prefix that FILE holds is restored, and only the rest
  // is computed.
  std::optional<CacheFingerprint> fingerprint;
  SessionRestore cached;
  if (!o.prompt_cache.empty()) {
    fingerprint = session_fingerprint(dir, *model, co);
    cached = restore_session(o.prompt_cache, *fingerprint, *model, cache, prompt, co);
  }

  ReplyText reply(o, tokenizer);
  const std::span<const int32_t> rest = std::span<const int32_t>(prompt).subspan(size_t(cached.n_cached));
  GenerateResult r = generate(*model, cache, rest, gp, [&](int32_t token) { return reply.push(token); });
  reply.finish();

  GenerateStats& s = r.stats;
  if (reply.stopped()) s.stop_reason = "stop";
  if (fingerprint) {
    // The cache holds the prompt and the reply but its last token; a file that cannot be
    // written is a warning, not a failed run.
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), r.tokens.begin(), r.tokens.end());
    try {
      save_session(o.prompt_cache, *fingerprint, *model, cache, all, co);
    } catch (const Error& e) {
      std::fprintf(stderr, "osprey: warning: prompt cache not saved: %s\n", e.what());
    }
  }
  if (o.json) print_json(prompt, r, reply.text(), gp.sampler.seed, cached, cache);
  print_summary(o, gp, s, cached, fingerprint.has_value(), prompt.size());
  return 0;
}

}  // namespace

GenerateParams generate_params(const EnvOptions& env) {
  GenerateParams p;
  p.pipelined = !env.force_sync;
  p.graphs = env.cuda_graphs;
  p.draft_cache.step = env.kv_step;
  p.draft_cache.inplace = env.kv_inplace_write;
  return p;
}

std::unique_ptr<Model> load_draft_model(const SpeculativeParams& spec, const Model& target,
                                        const Tokenizer* target_tokenizer, const Device& device, bool quiet) {
  if (spec.model_draft.empty()) return nullptr;
  if (spec.ngram)
    throw UsageError("--spec-ngram and --model-draft are two draft sources; give one of them");
  const std::string dir = model_folder(spec.model_draft, false);
  ProgressBar bar("loading draft " + model_name(dir));
  LoadOptions lo;
  lo.device = device;
  if (!quiet) lo.progress = [&](size_t done, size_t total) { bar.update(done, total); };
  return osprey::load_draft_model(dir, target, target_tokenizer, lo);
}

Command add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  add_model_options(app, o->model, o->download);
  auto* p = app.add_option("-p,--prompt", o->prompt, "Prompt text (tokenized with the model's tokenizer.json)");
  auto* f = app.add_option("-f,--file", o->prompt_file,
                           "Read the prompt from a file ('-': stdin); one final newline is dropped")
                   ->type_name("FILE");
  auto* t = app.add_option("--token-ids", o->token_ids, "Prompt as comma-separated token ids");
  p->excludes(f)->excludes(t);
  f->excludes(t);
  app.add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->check(int_range(0, INT32_MAX))->capture_default_str();
  app.add_option("-c,--ctx-size", o->ctx_size,
                 "Context length: prompt and reply together stop there (0: the model's max_position_embeddings)")
      ->check(int_range(0, INT32_MAX))
      ->capture_default_str();
  app.add_option("--stop", o->stops,
                 "Stop the generation where this text appears; the text itself is not printed (repeatable)")
      ->check(CLI::Validator([](std::string& s) { return s.empty() ? std::string("the stop text is empty") : std::string(); },
                             ""))
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add_sampler_options(app, o->sampler);
  add_spec_options(app, o->spec);
  add_device_option(app, o->device);
  add_cache_type_options(app, o->cache_type_k, o->cache_type_v);
  add_threads_option(app, o->threads);
  add_tensor_parallel_option(app, o->tensor_parallel);
  app.add_option("--grammar-file", o->grammar_file,
                 "Constrain the reply to a GBNF grammar (llama.cpp syntax; docs/server.md) read from this file");
  app.add_option("--json-schema", o->json_schema,
                 "Constrain the reply to JSON valid against this JSON Schema (the text, or @FILE)");
  app.add_flag("--json", o->json, "Print one JSON object instead of streaming text");
  app.add_option("--prompt-cache", o->prompt_cache,
                 "Restore the prompt's longest prefix from this file when it holds one of this model, and save the "
                 "prompt's and the reply's cache to it after the run (llama-cli's flag; written atomically)")
      ->type_name("FILE");
  app.add_flag("-v,--verbose", o->verbose, "Print the sampling seed on stderr");
  app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at end-of-sequence tokens");
  auto* chat = app.add_flag("--chat", o->chat, "Apply the model's chat template to the prompt as one user message");
  chat->excludes(t);
  auto* system = app.add_option("--system", o->system, "With --chat: a system message before the user's");
  app.add_flag("-q,--quiet", o->quiet, "No banner and no timing line on stderr");
  auto* image = app.add_option("--image", o->images,
                 "An image for the prompt (PNG, JPEG, WebP, GIF's first frame; Gemma 3; repeatable): with --chat "
                 "before the text; with -p/-f where the text writes <start_of_image>; with --token-ids the images "
                 "fill the prompt's runs of image tokens in order")
      ->type_name("FILE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add_pan_and_scan_option(app, o->pan_and_scan)->needs(image);
  return [o, p, f, t, chat, system, &app] {
    if (!*p && !*f && !*t) throw UsageError("generate: give a prompt with -p TEXT, -f FILE or --token-ids 1,2,3");
    o->sampler_flags = given_sampler_flags(app);
    if (*system && !*chat) throw UsageError("generate --system: needs --chat (the system message goes through the chat template)");
    if (!o->prompt_cache.empty() && o->tensor_parallel > 1)
      throw UsageError("generate --prompt-cache: not with --tensor-parallel (a file holds one rank's layout)");
    return run_generate(*o);
  };
}

}  // namespace osprey::cli
