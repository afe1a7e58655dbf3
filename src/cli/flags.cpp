#include "cli/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "core/thread_pool.h"
#include "grammar/json_schema.h"
#include "sample/sampler_fields.h"

namespace osprey::cli {
namespace {

std::string num(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

CLI::Validator real_range(double lo, double hi, bool lo_open, bool hi_open) {
  const std::string range = std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || (lo_open ? v <= lo : v < lo) ||
            (hi_open ? v >= hi : v > hi))
          return "\"" + s + "\" is not a number in " + range;
        return {};
      },
      "NUMBER in " + range);
}

CLI::Validator int_range(int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
          return "\"" + s + "\" is not an integer in " + range;
        return {};
      },
      "INT in " + range);
}

CLI::Validator unsigned_u64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        (void)std::strtoull(s.c_str(), &end, 10);
        if (!digits || errno == ERANGE) return "\"" + s + "\" is not an integer in [0, 2^64 - 1]";
        return {};
      },
      "UINT64");
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  size_t pos = 0;
  for (;;) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.empty()) throw UsageError(flag + ": \"" + text + "\" has an empty item");
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || v < lo || v > hi)
      throw UsageError(flag + ": \"" + item + "\" is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out.push_back(v);
    if (comma == std::string::npos) return out;
    pos = comma + 1;
  }
}

std::vector<std::string> given_sampler_flags(const CLI::App& app) {
  std::vector<std::string> given;
  for (const SamplerField& f : sampler_fields())
    if (app.count(f.flag) > 0) given.push_back(f.flag);
  return given;
}

void fill_unset_sampler_fields(SamplerParams& p, const SamplerParams& d, const std::vector<std::string>& given) {
  for (const SamplerField& f : sampler_fields())
    if (std::find(given.begin(), given.end(), f.flag) == given.end()) f.set(p, f.get(d));
}

void add_sampler_options(CLI::App& app, SamplerParams& p, bool checkpoint_defaults) {
  // With checkpoint_defaults the values in `p` are not the defaults: the command fills what no
  // flag set from the checkpoint's generation_config.json (osprey chat).
  const std::string from_checkpoint = " (default: the checkpoint's generation_config.json, else llama.cpp's)";
  for (const SamplerField& f : sampler_fields()) {
    const std::string help = std::string(f.help) + (checkpoint_defaults && f.from_config ? from_checkpoint : "");
    const CLI::Validator check =
        f.integer ? int_range(int64_t(f.lo), int64_t(f.hi)) : real_range(f.lo, f.hi, f.lo_open, f.hi_open);
    CLI::Option* opt = f.real ? app.add_option(f.flag, p.*(f.real), help) : app.add_option(f.flag, p.*(f.whole), help);
    opt->check(check);
    if (!checkpoint_defaults || !f.from_config) opt->capture_default_str();
  }
  // Without --seed, or with --seed -1 (llama.cpp's "random"), the seed is a fresh random one.
  p.seed = random_seed();
  app.add_option_function<std::string>(
         "--seed", [&p](const std::string& s) { p.seed = s == "-1" ? random_seed() : std::stoull(s); },
         "Sampling seed: the same seed repeats a sampled reply (default and -1: a random seed)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            if (s == "-1") return {};
            std::string t = s;
            const std::string e = unsigned_u64()(t);
            return e.empty() ? e : "\"" + s + "\" is not -1 or an integer in [0, 2^64 - 1]";
          },
          "-1|UINT64"));
}

void add_model_options(CLI::App& app, std::string& model, bool& download, const std::string& folder_holds) {
  const std::string folder = folder_holds.empty() ? "Model folder" : folder_holds;
  app.add_option("-m,--model", model,
                 folder + ", a GGUF file, or a Hub id org/name[:revision] (default: the embedded default model)");
  app.add_flag("--download", download, "Fetch a Hub model missing from the Hugging Face cache (as osprey pull does)");
}

CLI::Option* add_template_name_option(CLI::App& app, std::string& name) {
  return app.add_option("--template-name", name, "Which of the folder's named templates (default: \"default\")");
}

CLI::Option* add_device_option(CLI::App& app, std::string& device) {
  return app.add_option("--device", device, "cpu, cuda or cuda:N (default: OSPREY_DEVICE, else cuda when present)");
}

CLI::Option* add_threads_option(CLI::App& app, int& threads) {
  return app.add_option("-t,--threads", threads, "CPU threads (default: OSPREY_THREADS or one per physical core)")
      ->check(int_range(0, kMaxCpuThreads));
}

CLI::Option* add_pan_and_scan_option(CLI::App& app, std::optional<bool>& on) {
  return app.add_flag_function(
      "--pan-and-scan,!--no-pan-and-scan", [&on](int64_t count) { on = count > 0; },
      "Images (Gemma 3): also cut a long or tall image into 2-4 crops that the model sees after it, as "
      "transformers' pan-and-scan does (more image tokens per image; default: the model's "
      "preprocessor_config.json, else off)");
}

CLI::Option* add_tensor_parallel_option(CLI::App& app, int& ranks) {
  return app
      .add_option("--tensor-parallel", ranks,
                  "-tp N: split the model across N ranks (tensor parallelism, every family; N must divide "
                  "the attention heads). With --device cuda:I: GPUs I .. I + N - 1 over NCCL. On the CPU: N threads "
                  "of this process, a check of the sharding and not a speed-up")
      ->check(int_range(1, kMaxTensorParallel))
      ->capture_default_str()
      ->group("Advanced");
}

void add_cache_type_options(CLI::App& app, std::string& k, std::string& v) {
  for (auto [flag, value, what] : {std::tuple{"--cache-type-k", &k, "keys"}, std::tuple{"--cache-type-v", &v, "values"}})
    app.add_option(flag, *value,
                   std::string(flag == std::string("--cache-type-k") ? "-ctk" : "-ctv") + " TYPE: the KV cache's " +
                       what + ": f16, bf16, q8_0 (blocks of 32 int8 with an f16 scale, 1.06 bytes an element) or "
                       "fp8 (e4m3 with a float32 scale per head and row, 1.03 bytes an element at head_dim 128); q8_0 "
                       "and fp8 on the CPU only for now (default: the model's 16-bit type)")
        ->check(CLI::Validator(
            [flag](std::string& s) -> std::string {
              try {
                parse_kv_cache_type(s, flag);
              } catch (const Error& e) {
                // CLI11 names the flag itself.
                std::string m = e.what();
                const std::string prefix = std::string(flag) + ": ";
                if (m.rfind(prefix, 0) == 0) m.erase(0, prefix.size());
                return m;
              }
              return "";
            },
            "TYPE"))
        ->group("Advanced");
}

std::optional<DType> cache_type(const std::string& value, const char* flag) {
  if (value.empty()) return std::nullopt;
  return parse_kv_cache_type(value, flag);
}

// The grammar of --grammar-file or --json-schema; a usage error names the flag at fault.
grammar::Grammar read_grammar_flags(const std::string& command, const std::string& grammar_file,
                                   const std::string& json_schema) {
  if (!grammar_file.empty() && !json_schema.empty())
    throw UsageError(command + ": --grammar-file and --json-schema both constrain the output; give one");
  auto read = [](const std::string& path, const char* flag) {
    if (std::filesystem::is_directory(path)) throw UsageError(std::string(flag) + " " + path + ": is a directory, not a file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError(std::string(flag) + " " + path + ": cannot open: " + std::strerror(errno));
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  try {
    if (!grammar_file.empty()) return grammar::parse_gbnf(read(grammar_file, "--grammar-file"));
    const std::string text = json_schema[0] == '@' ? read(json_schema.substr(1), "--json-schema") : json_schema;
    nlohmann::ordered_json schema;
    try {
      schema = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(std::string("--json-schema: not valid JSON: ") + e.what());
    }
    return grammar::parse_gbnf(grammar::schema_to_gbnf(schema));
  } catch (const UsageError&) {
    throw;
  } catch (const InvalidInput& e) {
    throw UsageError(std::string(!grammar_file.empty() ? "--grammar-file: " : "--json-schema: ") + e.what());
  }
}

void add_spec_options(CLI::App& app, SpeculativeParams& p) {
  app.add_flag("--spec-ngram", p.ngram,
               "Speculative decoding with prompt-lookup drafts: the tokens that followed the longest recent n-gram "
               "earlier in the prompt and reply, verified in one multi-row step (lossless: the tokens of plain "
               "decoding)");
  add_int_option(app, "--spec-ngram-min", p.ngram_min, "--spec-ngram: shortest n-gram looked up", 1, 16);
  add_int_option(app, "--spec-ngram-max", p.ngram_max, "--spec-ngram: longest n-gram looked up", 1, 16);
  app.add_option("--model-draft", p.model_draft,
                 "Speculative decoding with a draft model (-md; a folder or Hub id): a smaller model of the same "
                 "tokenizer drafts greedily (sampled requests: from its own distribution, accepted by rejection "
                 "sampling), verified in one multi-row step. A draft whose tokenizer differs is refused. Not with "
                 "--spec-ngram")
      ->type_name("DIR");
  app.add_option("--draft-p-min", p.draft_p_min,
                 "--model-draft: stop drafting when the draft's most likely token has a probability below this "
                 "(0: always draft --draft-max tokens)")
      ->check(real_range(0, 1))
      ->capture_default_str();
  app.add_option("--spec-min-acceptance", p.min_acceptance,
                 "Speculative decoding: a sequence whose drafts are accepted at a lower rate (accepted over drafted "
                 "tokens, judged every 32 drafted) stops drafting for a while, backing off longer each time (0: "
                 "never stops)")
      ->check(real_range(0, 1))
      ->capture_default_str();
  add_int_option(app, "--draft-max", p.draft_max, "Speculative decoding: most tokens drafted per step", 1, 64);
  add_int_option(app, "--draft-min", p.draft_min,
                 "Speculative decoding: fewest drafted tokens worth a verify step (shorter drafts decode one token)",
                 1, 64);
  // A tuning flag without the drafting it tunes would be ignored: refused by name instead.
  app.parse_complete_callback([&app] {
    const bool ngram = app.count("--spec-ngram") > 0, draft = app.count("--model-draft") > 0;
    const struct {
      const char* flag;
      bool applies;
      const char* needs;
    } tuning[] = {{"--spec-ngram-min", ngram, "--spec-ngram"}, {"--spec-ngram-max", ngram, "--spec-ngram"},
                  {"--draft-p-min", draft, "--model-draft"},   {"--draft-max", ngram || draft, "--spec-ngram or --model-draft"},
                  {"--draft-min", ngram || draft, "--spec-ngram or --model-draft"},
                  {"--spec-min-acceptance", ngram || draft, "--spec-ngram or --model-draft"},
                  {"--spec-max-batch", ngram || draft, "--spec-ngram or --model-draft"}};
    for (const auto& t : tuning)
      if (!t.applies && app.get_option_no_throw(t.flag) != nullptr && app.count(t.flag) > 0)
        throw CLI::ValidationError(t.flag, std::string("tunes speculative decoding, which is off: add ") + t.needs);
  });
}

}  // namespace osprey::cli
