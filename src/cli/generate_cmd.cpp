#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/device_select.h"
#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "core/env.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "dist/sharded_model.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace osprey::cli {
namespace fs = std::filesystem;

std::string default_model_dir() {
  const fs::path dir = OSPREY_DEFAULT_MODEL_DIR;
  if (!fs::exists(dir / "config.json"))
    throw IoError("the embedded default model is missing at " + dir.string() +
                  ": run scripts/setup.sh to make it, or pass -m DIR");
  return dir.string();
}

namespace {

struct GenerateOptions {
  std::string model;
  std::optional<std::string> prompt;
  std::string token_ids;
  int n_predict = 128;
  SamplerParams sampler;
  bool json = false;
  bool verbose = false;
  bool ignore_eos = false;
  bool chat = false;
  int threads = -1;
  std::string device;
  int tensor_parallel = 1;
};

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

int run_generate(const GenerateOptions& o) {
  if (o.threads >= 0) set_cpu_threads(o.threads);
  const std::string dir = o.model.empty() ? default_model_dir() : o.model;
  if (!fs::exists(dir)) throw IoError("model folder " + dir + " does not exist");

  std::optional<Tokenizer> tokenizer;
  if (o.prompt || fs::exists(fs::path(dir) / "tokenizer.json")) tokenizer = Tokenizer::load(dir);
  std::vector<int32_t> prompt;
  if (o.chat) {
    // The template writes BOS itself: no second one from the post-processor.
    nlohmann::ordered_json request = {{"messages", {{{"role", "user"}, {"content", *o.prompt}}}}};
    prompt = tokenizer->encode(ChatTemplate::load(dir).render(request), false);
  } else {
    prompt = o.prompt ? tokenizer->encode(*o.prompt, true) : parse_token_ids(o.token_ids);
  }

  std::unique_ptr<Model> model;
  {
    ProgressBar bar("loading " + fs::path(dir).filename().string());
    LoadOptions lo;
    lo.device = select_device(o.device.empty() ? env_options().device : o.device);
    lo.progress = [&](size_t done, size_t total) { bar.update(done, total); };
    model = load_sharded_model(dir, o.tensor_parallel, lo);
  }

  GenerateParams gp = generate_params(env_options());
  gp.max_tokens = o.n_predict;
  gp.sampler = o.sampler;
  if (!o.ignore_eos) {
    gp.stop_ids = model->info().eos_ids;
    if (tokenizer)
      for (int32_t id : tokenizer->eos_ids())
        if (std::find(gp.stop_ids.begin(), gp.stop_ids.end(), id) == gp.stop_ids.end()) gp.stop_ids.push_back(id);
  }
  validate(gp.sampler);
  if (o.verbose) std::fprintf(stderr, "seed: %llu\n", (unsigned long long)gp.sampler.seed);

  const EnvOptions& env = env_options();
  KVCacheParams co;
  co.step = env.kv_step;
  co.inplace = env.kv_inplace_write;
  SequenceCache cache = model->make_cache(co);

  std::optional<Tokenizer::StreamDecoder> stream;
  if (tokenizer && !o.json) stream.emplace(*tokenizer);
  GenerateResult r = generate(*model, cache, prompt, gp, [&](int32_t token) {
    if (stream) {
      std::string piece = stream->push(token);
      if (!piece.empty()) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
    }
    return true;
  });
  if (stream) {
    std::string rest = stream->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  const GenerateStats& s = r.stats;
  if (o.json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt;
    j["tokens"] = r.tokens;
    j["text"] = tokenizer ? tokenizer->decode(r.tokens, true) : std::string();
    j["stop_reason"] = s.stop_reason;
    j["seed"] = gp.sampler.seed;
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
                    {"graph_captures", s.n_graph_captures}};
    std::string out = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", out.c_str());
  }
  std::fprintf(stderr, "prompt: %lld tokens, %.1f t/s | decode: %lld tokens, %.1f t/s | kv writes: %llu in place, %llu copying\n",
               (long long)s.n_prompt, s.prompt_tps(), (long long)s.n_generated, s.decode_tps(),
               (unsigned long long)s.kv.n_inplace_writes, (unsigned long long)s.kv.n_copying_writes);
  return 0;
}

}  // namespace

GenerateParams generate_params(const EnvOptions& env) {
  GenerateParams p;
  p.pipelined = !env.force_sync;
  p.graphs = env.cuda_graphs;
  return p;
}

Command add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  app.add_option("-m,--model", o->model, "Model folder (default: the embedded default model)");
  auto* p = app.add_option("-p,--prompt", o->prompt, "Prompt text (tokenized with the model's tokenizer.json)");
  auto* t = app.add_option("--token-ids", o->token_ids, "Prompt as comma-separated token ids");
  p->excludes(t);
  app.add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->check(int_range(0, INT32_MAX));
  add_sampler_options(app, o->sampler);
  app.add_option("--device", o->device, "cpu, cuda or cuda:N (default: OSPREY_DEVICE, else cuda when present)");
  add_threads_option(app, o->threads);
  add_tensor_parallel_option(app, o->tensor_parallel);
  app.add_flag("--json", o->json, "Print one JSON object instead of streaming text");
  app.add_flag("-v,--verbose", o->verbose, "Print the sampling seed on stderr");
  app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at end-of-sequence tokens");
  app.add_flag("--chat", o->chat, "Apply the model's chat template to -p as one user message")->excludes(t);
  return [o, p, t] {
    if (!*p && !*t) throw UsageError("generate: give a prompt with -p TEXT or --token-ids 1,2,3");
    if (o->chat && !*p) throw UsageError("generate --chat: give the user message with -p TEXT");
    return run_generate(*o);
  };
}

}  // namespace osprey::cli
